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
this process, its progress bars on the console). A stage is
complete when its marker `.evalm-stage.json` exists (written last, with the arguments it ran with,
its seconds and the peak memory so far); a rerun skips complete stages, resumes interrupted data
and training stages (their own relaunch logic), and redoes the rest. Each marker holds the stage's
key (`stage_key`: its commands, the content of the settings files and sample folders they name,
and the previous stage's key): a changed key redoes the stage and, through the chain, every later
one; `--only STAGE` marks the later stages stale.

A run file whose top section is `[study]` is a study, not the main job: `evalm run --config
configs/study-convert.toml` runs its steps (launcher/study.py).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

from evalm.config_toolkit import ConfigError, Parser, UserError, report, shipped, split_overrides
from evalm.config_toolkit.machine import peak_rss_gib
from evalm.launcher.keys import stage_key
from evalm.launcher.markers import discard_stage, mark_stale, read_marker, write_marker
from evalm.launcher.report import stage_result, write_report
from evalm.launcher.run_file import Run, load_run
from evalm.launcher.schedule import run_steps
from evalm.launcher.stages import RESUMABLE, STAGES, Step, stage_steps
from evalm.storage import RunFolder

DEFAULT_CONFIG = shipped("configs/tiny.toml")


def plan_stage(r: Run, stage: str, commands: list[list[str]], position: str, previous: str, folder: RunFolder
               ) -> tuple[bool, str]:
    """Whether a stage must run (not complete with the same key), and its key; a complete stage whose key
    changed (or that `--only` marked stale) is discarded, to be redone from scratch."""
    key = stage_key(r, stage, commands, previous, identity=folder.identity)
    done = read_marker(r, stage)
    if done is not None and done.get("key") == key and not done.get("stale"):
        print(f"stage {position} {stage}: complete, skipped ({done['seconds']:.0f} s when it ran)")
        return False, key
    if done is not None:  # changed settings or inputs: the old outputs must not be resumed
        why = "marked stale by --only" if done.get("stale") else "its settings or inputs changed"
        print(f"stage {position} {stage}: {why}; redoing it")
        discard_stage(r, stage)
    elif stage not in RESUMABLE:
        discard_stage(r, stage)
    return True, key


class _Stages:
    """The stages one invocation runs, from their steps' start and end: the first step prints the
    stage's line and marks its folder as made by this run; the last writes its marker (key, commands,
    the seconds its steps ran, summed: with jobs > 1 stages overlap, and the invocation's wall is less)."""

    def __init__(self, r: Run, planned: dict[str, tuple[str, str, list[Step]]]):
        self.r, self.planned = r, planned
        self.steps = {stage: steps for stage, (_, _, steps) in planned.items()}
        self.stage_of = {step.name: stage for stage, steps in self.steps.items() for step in steps}
        self.left = {stage: len(steps) for stage, steps in self.steps.items()}
        self.seconds = dict.fromkeys(planned, 0.0)
        self.begun: set[str] = set()

    def log(self, step: Step) -> Path:
        return self.r.dir / "logs" / f"{step.name}.log"

    def started(self, step: Step) -> None:
        stage = self.stage_of[step.name]
        if stage not in self.begun:
            self.begun.add(stage)
            self._begin(stage)

    def _begin(self, stage: str) -> None:
        RunFolder(self.r.stage_dir(stage), "evalm run").mark()  # made by this run: what discard_stage may delete later
        print(f"stage {self.planned[stage][0]} {stage} ...", flush=True)

    def finished(self, step: Step, seconds: float) -> None:
        stage = self.stage_of[step.name]
        self.seconds[stage] += seconds
        self.left[stage] -= 1
        if not self.left[stage]:
            self._complete(stage)

    def _complete(self, stage: str) -> None:
        r, (position, key, steps) = self.r, self.planned[stage]
        seconds = self.seconds[stage]
        write_marker(r, stage, {"stage": stage, "key": key, "commands": [s.argv for s in steps], "seconds": seconds,
                                "jobs": r.run.jobs, "peak_rss_gib_so_far": peak_rss_gib(children=True)})
        logs = self.log(steps[0]) if len(steps) == 1 else self.r.dir / "logs" / f"{stage}*.log"
        print(f"stage {position} {stage}: {stage_result(r, stage)} ({seconds:.0f} s; log {logs})", flush=True)

    def run(self) -> dict[str, float]:
        for stage in [s for s, steps in self.steps.items() if not steps]:  # a stage with nothing to do (twins off)
            self._begin(stage)
            self._complete(stage)
        steps = [step for steps in self.steps.values() for step in steps]
        run_steps(steps, self.r.run.jobs, self.log, self.started, self.finished)
        return self.seconds


def ensure_samples(r: Run) -> None:
    """Build the samples when their folder is missing. `evalm data samples` writes it under a
    temporary name and renames it last, so an existing folder is complete, or the user's own
    data in the same layout (pile/, books/, tasks/, instructions/)."""
    if r.samples.is_dir():
        return
    from evalm.launcher.samples import build_samples

    print(f"[samples] {r.samples} missing: building it from pinned PyPI packages (`evalm data samples`)")
    build_samples(r.samples)


def _parser() -> Parser:
    parser = Parser(prog="evalm run", description=__doc__)
    parser.add_argument("config", nargs="?", default=str(DEFAULT_CONFIG), help="run file (default: configs/tiny.toml)")
    parser.add_argument("--config", dest="config_flag", metavar="FILE",
                        help="run file, as the positional CONFIG; a file whose top section is [study] runs as a "
                             "study (launcher/study.py: --only/--from name its steps, --list, --root) (default: none: CONFIG)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--from", dest="start", choices=list(STAGES), metavar="STAGE",
                       help=f"rerun this stage and every later one; one of {', '.join(STAGES)} "
                            "(default: none, run every stage that is not complete)")
    where.add_argument("--only", choices=list(STAGES), metavar="STAGE",
                       help="rerun just this stage; the later ones are marked stale (default: none)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one run-file value, e.g. --set run.seed=2 (every training stage's seed) or "
                             "--set run.name=tiny-seed2 (the run folder); repeatable (default: none)")
    return parser


def _stages_to_run(r: Run, start: str | None, only: str | None) -> list[str]:
    """Every stage, or `--from` X onward, or `--only` X; their folders are cleared (earlier ones must be complete)."""
    stages = list(STAGES)
    if not (start or only):
        return stages
    first = stages.index(start or only)
    missing = [s for s in stages[:first] if read_marker(r, s) is None]
    if missing:
        raise ConfigError(f"{r.dir}: stage(s) {missing} before {stages[first]!r} are not complete; "
                          f"run `evalm run {r.path}` first")
    stages = stages[first:] if start else [only]
    for stage in stages:
        discard_stage(r, stage)
    return stages


def run_all(r: Run, start: str | None, only: str | None) -> Path:
    """Run the chosen stages in order, chaining their keys; returns the report folder."""
    folder = RunFolder(r.dir, "evalm run")  # its digest cache: the stage keys' inputs, read once per change
    stages = _stages_to_run(r, start, only)
    t0 = time.perf_counter()
    ensure_samples(r)
    order = list(STAGES)
    previous = (read_marker(r, order[order.index(stages[0]) - 1]) or {}).get("key", "") if stages[0] != order[0] else ""
    planned, timings = {}, {}
    for i, stage in enumerate(stages, 1):  # keys first: they hash commands and settings, never a stage's outputs
        position, steps = f"{i}/{len(stages)}", stage_steps(r, stage)
        todo, previous = plan_stage(r, stage, [s.argv for s in steps], position, previous, folder)
        if todo:
            planned[stage] = (position, previous, steps)
        else:
            timings[stage] = 0.0
    timings |= _Stages(r, planned).run()
    timings = {stage: timings[stage] for stage in stages}
    if only:
        mark_stale(r, order[order.index(only) + 1:])
    return write_report(r, timings, wall_seconds=time.perf_counter() - t0, peak_rss_gib=peak_rss_gib(children=True))


VALUED = ("--from", "--only", "--set", "--root", "--config")
"""Options of `evalm run` (main job or study) followed by a value: what `_config_of` steps over."""


def _config_of(argv: Sequence[str]) -> str | None:
    """The run file an `evalm run` command line names (`--config FILE` or the first positional)."""
    args = list(argv)
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    for i, arg in enumerate(args):
        if not arg.startswith("-") and (i == 0 or args[i - 1] not in VALUED):
            return arg
    return None


def _is_study(argv: Sequence[str]) -> bool:
    """Whether the run file is a study (`[study]`); a file that cannot be read is left to the main job's
    path, which names the problem in one line."""
    from evalm.launcher.study_file import is_study

    path = _config_of(argv)
    try:
        return path is not None and is_study(path)
    except UserError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """A user error (config_toolkit.UserError: a bad run file, a failed stage, a busy folder) is one
    line; anything else is a bug of ours, its traceback kept in ROOT/NAME/logs/error.log (the run
    folder it escaped from) and named on the console (config_toolkit.report, as every command)."""
    argv = list(argv if argv is not None else sys.argv[1:])
    if _is_study(argv):
        from evalm.launcher.study import main as study

        return study(argv)
    parser = _parser()
    try:
        dotted, rest = split_overrides(argv)  # --run.seed=2 is --set's alias
    except ConfigError as err:
        parser.exit(2, f"evalm run: error: {err}\n")
    args = parser.parse_args(rest)
    if args.config_flag:
        if args.config != str(DEFAULT_CONFIG):
            parser.error(f"give the run file once: {args.config} and --config {args.config_flag}")
        args.config = args.config_flag
    try:
        r = load_run(args.config, [*dotted, *args.overrides])
        with RunFolder(r.dir, "evalm run").held():  # one main job per run folder
            folder = run_all(r, args.start, args.only)
    except KeyboardInterrupt:
        again = " ".join(["evalm run", args.config, *(f"--set {o}" for o in [*dotted, *args.overrides])])
        print(f"evalm run: interrupted; rerun `{again}` to resume: complete stages are skipped, "
              "data and training stages continue from where they stopped", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - the one rule of every command
        return report("evalm run", err)
    print(f"\nreport: {folder / 'summary.md'}")
    return 0
