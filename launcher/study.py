"""`evalm run --config configs/study-NAME.toml`: a study's steps, run by the one runner of `evalm run`.

    evalm run --config configs/study-convert.toml               # every step not done yet
    evalm run --config configs/study-convert.toml --list        # the steps and their state
    evalm run --config configs/study-convert.toml --only ppl-original,icl-original
    evalm run --config configs/study-convert.toml --from lora-rope --root /data/convert
    evalm run --config configs/study-summaries.toml --summary  # its report alone, from the file's [summary]

A study (`launcher.study_file`) is a list of `evalm` commands beside the paper's chain, and its steps are
units of the runner that runs the main job's stages (`launcher.runner`), with the same meaning of done
and the same flags. Each step runs as a child process of this interpreter (`launcher.schedule.run_teed`:
a GPU's memory is freed when it ends), its output on the console and in ROOT/logs/STEP.log. A step is
done when its marker ROOT/steps/STEP.done holds its key: its command as recorded and the keys of the
steps it needs, so a changed step reruns and so does every step that reads it, directly or through
others. A step that stopped part-way is run again, and the commands that resume on their own (`evalm
train uptrain --resume auto`, `evalm eval ...`) resume. `--from STEP` reruns a step and every later one;
`--only A,B` reruns just those and marks the steps that read them stale.

The study's folder ROOT is a run folder of `evalm run` (storage.RunFolder): held while the study runs
(one invocation per folder), written only when it is empty or was made by `evalm run` (never a model
folder or another command's run), its `steps/` and `logs/` never through a link.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

from evalm.config_toolkit import ConfigError
from evalm.launcher.runner import Choice, Runner, Step, Unit
from evalm.launcher.schedule import run_teed
from evalm.launcher.study_file import Study, load_study
from evalm.launcher.study_report import write_report
from evalm.storage import LinkedOutput, RunFolder, made_by, write_json
from evalm.storage.run_folder import MARKER, RUN


class StudyJob:
    """A study's steps as the runner's units: one command each, the marker in ROOT/steps, the log in ROOT/logs."""

    noun = "step"

    def __init__(self, study: Study, again: str):
        self.study, self.path, self.folder, self.command = study, study.path, study.root, again
        steps = study.root / "steps"
        self.units = [Unit(s.name, (Step(s.name, s.argv, s.needs, s.shown),), s.needs, steps / f"{s.name}.done",
                           (s.shown,)) for s in study.steps]

    def clear(self, unit: Unit, why: str) -> None:
        """Nothing beyond the marker: a step's own command resumes its folder or refuses other settings."""

    def begin(self, unit: Unit, position: str) -> None:
        print(f"step {position} {unit.name}: evalm {' '.join(unit.steps[0].record())}", flush=True)

    def log(self, step: Step) -> Path:
        return self.study.root / "logs" / f"{step.name}.log"

    def execute(self, steps: Sequence[Step], started: Callable[[Step], None],
                finished: Callable[[Step, float], None]) -> None:
        run_teed(steps, self.log, started, finished)

    def extra(self, unit: Unit) -> dict:
        return {"study": self.study.section.name}

    def finish(self, unit: Unit, position: str, seconds: float) -> None:
        print(f"step {position} {unit.name}: done ({seconds:.0f} s; log {self.log(unit.steps[0])})", flush=True)


def adopt(root: Path) -> None:
    """A study folder the runner made before its folder marker existed (its `steps/` holds done markers) is
    marked as `evalm run`'s, so it is resumed, not refused as another command's folder."""
    steps = root / "steps"
    if made_by(root) is None and steps.is_dir() and not steps.is_symlink() and any(steps.glob("*.done")):
        write_json(root / MARKER, {"command": RUN, "made": time.strftime("%Y-%m-%dT%H:%M:%S%z")})


def run_study(path: str | Path, raw: dict, overrides: Sequence[str], root: str | None, choice: Choice,
              again: str) -> int:
    """`evalm run` on a study file (read once by `launcher.run.main`): `--list`, `--summary`, or its steps under
    the folder's owner, then its report when the file declares one."""
    study = load_study(path, overrides, root, raw=raw)
    for sub in ("steps", "logs"):  # before a marker is read through one
        if (study.root / sub).is_symlink():
            raise LinkedOutput(f"{study.root / sub} is a symbolic link; evalm never writes through a link (its markers "
                               "and logs would land in the folder it points to): remove the link and rerun")
    runner = Runner(StudyJob(study, again))
    if choice.listing:
        about = f": {study.section.about}" if study.section.about else ""
        print(f"study {study.section.name} ({study.root}){about}\n{runner.listing()}")
        return 0
    if choice.summary:
        return summarize(study)
    runner.select(choice.only, choice.start)  # a bad selection is refused before the folder is made
    adopt(study.root)
    folder = RunFolder(study.root, RUN)
    with folder.held():  # one invocation per study folder; never a folder another command made
        folder.mark("steps")  # never written or deleted through a link
        folder.mark("logs")
        seconds = runner.run(choice.only, choice.start)
        if study.summary is not None:
            print(f"wrote {write_report(study.root, study.summary, study.section.name)}")
    ran = len(runner.ran)
    print(f"study {study.section.name}: {ran} step(s) run, {len(seconds) - ran} skipped; folder {study.root}")
    return 0


def summarize(study: Study) -> int:
    """`--summary`: the report alone, printed and written (a study without [summary] is one line)."""
    if study.summary is None:
        raise ConfigError(f"{study.path}: no [summary] section; declare its tables and goals there "
                          "(launcher/study_report.py)")
    path = write_report(study.root, study.summary, study.section.name)
    print(path.read_text(encoding="utf-8"))
    return 0
