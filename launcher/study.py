"""`evalm run --config configs/study-NAME.toml`: a study's steps in order, each once, resumable.

    evalm run --config configs/study-convert.toml               # every step not done yet
    evalm run --config configs/study-convert.toml --list        # the steps and their state
    evalm run --config configs/study-convert.toml --only ppl-original,icl-original
    evalm run --config configs/study-convert.toml --from lora-rope --root /data/convert

A study (`launcher.study_file`) is the main job's machinery for a question beside the paper's chain:
each step is an `evalm` command, run as a child process of this interpreter (the same child as a
`[run] jobs` step of the main job, `launcher.schedule.CHILD`), its output on the console and in
ROOT/logs/STEP.log. A step is done when its command exits 0: its marker ROOT/steps/STEP.done holds its
argv. A rerun skips a done step whose argv is the same and reruns one whose argv changed (saying so);
a step that stopped part-way is run again, and the commands that resume on their own (`evalm train
uptrain`, `evalm eval ...`) resume. A changed step does not rerun the steps after it: a command's own
run folder refuses settings it was not made with, and `--from STEP` reruns a step and every later one.
`--only A,B` reruns just those; either needs the steps they need to be done already.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from evalm.config_toolkit import ConfigError, Parser, report, split_overrides
from evalm.launcher.console import StageFailed
from evalm.launcher.schedule import CHILD
from evalm.launcher.study_file import Study, StudyStep, load_study
from evalm.launcher.study_report import write_report
from evalm.storage import folder_lock, read_json, redact_argv, write_json
from evalm.storage.files import appended

DONE, CHANGED, TODO = "done", "changed", "to run"


def marker(study: Study, name: str) -> Path:
    return study.root / "steps" / f"{name}.done"


def log_of(study: Study, name: str) -> Path:
    return study.root / "logs" / f"{name}.log"


def recorded(step: StudyStep) -> list[str]:
    """A step's argv as its marker holds it (a --redis-url password is not recorded)."""
    return redact_argv(step.argv)


def state(study: Study, step: StudyStep) -> str:
    """DONE (marker with this argv), CHANGED (marker with another argv) or TODO (no marker)."""
    path = marker(study, step.name)
    if not path.is_file():
        return TODO
    return DONE if read_json(path, "a step marker") == recorded(step) else CHANGED


def select(study: Study, only: str | None, start: str | None) -> tuple[list[StudyStep], bool]:
    """The steps this invocation considers, and whether they rerun even when done (`--only` / `--from`);
    a step they need outside the selection must be done."""
    names = study.names()
    asked = [n.strip() for n in only.split(",")] if only else [start] if start else []
    unknown = [n for n in asked if n not in names]
    if unknown:
        flag = "--only" if only else "--from"
        raise ConfigError(f"{study.path}: {flag} {unknown}: no such step; valid: {names}")
    if not asked:
        return list(study.steps), False
    chosen = [s for s in study.steps if s.name in asked] if only else list(study.steps[names.index(start):])
    inside = {s.name for s in chosen}
    for step in chosen:
        missing = [n for n in step.needs if n not in inside and state(study, study.step(n)) != DONE]
        if missing:
            raise ConfigError(f"{study.path}: step {step.name!r} needs {missing}, not done; run "
                              f"`evalm run --config {study.path}` first (or name them too)")
    return chosen, True


def run_step(step: StudyStep, log: Path) -> int:
    """Run `evalm ARGV` as a child process; its lines go to the console and to `log`. Returns its exit code."""
    with appended(log) as f:  # never through a link
        f.write(f"\n$ evalm {' '.join(recorded(step))}\n")
        f.flush()
        proc = subprocess.Popen([sys.executable, "-c", CHILD, *step.argv], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                f.write(line)
        except KeyboardInterrupt:  # the child got the same Ctrl-C (same process group): let it stop cleanly
            proc.wait()
            raise
        return proc.wait()


def check(study: Study, step: StudyStep, code: int) -> None:
    """A failed step stops the study, naming the step, its exit code and its log."""
    if code in (130, -signal.SIGINT):
        raise KeyboardInterrupt
    if code:
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with {code}"
        raise StageFailed(f"step {step.name!r} (`evalm {' '.join(recorded(step))}`) {how}; its output is in "
                          f"{log_of(study, step.name)}; fix it, then rerun `evalm run --config {study.path}`")


def run_study(study: Study, steps: Sequence[StudyStep], force: bool) -> dict[str, str]:
    """Run `steps` in order (skipping done ones unless `force`); returns what happened to each."""
    outcome = {}
    for i, step in enumerate(steps, 1):
        position, now = f"{i}/{len(steps)}", state(study, step)
        if now == DONE and not force:
            print(f"step {position} {step.name}: done, skipped", flush=True)
            outcome[step.name] = "skipped"
            continue
        if now == CHANGED:
            print(f"step {position} {step.name}: its command changed since it ran; running it again", flush=True)
        marker(study, step.name).unlink(missing_ok=True)
        print(f"step {position} {step.name}: evalm {' '.join(recorded(step))}", flush=True)
        t0 = time.perf_counter()
        check(study, step, run_step(step, log_of(study, step.name)))
        write_json(marker(study, step.name), recorded(step))
        print(f"step {position} {step.name}: done ({time.perf_counter() - t0:.0f} s; log {log_of(study, step.name)})",
              flush=True)
        outcome[step.name] = "ran"
    return outcome


def listing(study: Study) -> str:
    """`--list`: every step, its state and its command."""
    lines = [f"study {study.section.name} ({study.root}): {study.section.about}".rstrip(": ")]
    for step in study.steps:
        lines.append(f"  {step.name:<28} {state(study, step):<8} evalm {' '.join(recorded(step))}")
    return "\n".join(lines)


def summarize(study: Study) -> int:
    """`--summary`: the report alone, printed and written (a study without [summary] is one line)."""
    if study.summary is None:
        raise ConfigError(f"{study.path}: no [summary] section; declare its tables and goals there "
                          "(launcher/study_report.py)")
    path = write_report(study.root, study.summary, study.section.name)
    print(path.read_text(encoding="utf-8"))
    return 0


def _parser() -> Parser:
    parser = Parser(prog="evalm run", description=__doc__)
    parser.add_argument("config", nargs="?", help="the study file (or --config FILE; required)")
    parser.add_argument("--config", dest="config_flag", metavar="FILE", help="the study file (default: none: CONFIG)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--from", dest="start", metavar="STEP", help="rerun this step and every later one (default: none)")
    where.add_argument("--only", metavar="STEP[,STEP...]", help="rerun just these steps (default: none)")
    where.add_argument("--list", action="store_true", help="print the steps and their state; run nothing (default: off)")
    where.add_argument("--summary", action="store_true", help="write the study's report from the file's [summary] "
                       "(launcher/study_report.py); run nothing (default: off: written after the steps)")
    parser.add_argument("--root", help="the study's folder (default: its [study] root)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="study.KEY=VALUE",
                        help="override a [study] value, e.g. --set study.root=/data/convert; repeatable (default: none)")
    return parser


def main(argv: Sequence[str]) -> int:
    """`evalm run` on a study file: a user error is one line (config_toolkit.report), Ctrl-C the resume hint."""
    parser = _parser()
    try:
        dotted, rest = split_overrides(list(argv))
    except ConfigError as err:
        parser.exit(2, f"evalm run: error: {err}\n")
    args = parser.parse_args(rest)
    path = args.config_flag or args.config
    try:
        study = load_study(path, [*dotted, *args.overrides], args.root)
        if args.list:
            print(listing(study))
            return 0
        if args.summary:
            return summarize(study)
        steps, force = select(study, args.only, args.start)
        study.root.mkdir(parents=True, exist_ok=True)
        with folder_lock(study.root, "evalm run"):  # one invocation per study folder
            outcome = run_study(study, steps, force)
            if study.summary:
                print(f"wrote {write_report(study.root, study.summary, study.section.name)}")
    except KeyboardInterrupt:
        print(f"evalm run: interrupted; rerun `evalm run --config {path}` to resume: done steps are skipped",
              file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - the one rule of every command
        return report("evalm run", err)
    ran = sum(v == "ran" for v in outcome.values())
    print(f"study {study.section.name}: {ran} step(s) run, {len(outcome) - ran} skipped; folder {study.root}")
    return 0
