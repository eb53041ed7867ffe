"""The run file of a study: `[study]` and its `[[step]]`s, validated (`evalm run --config configs/study-NAME.toml`).

    [study] name = "convert-smollm2", root = "runs/convert-smollm2", about = "what the study asks"
    [study.vars] seq_len = 8192                         # `{seq_len}` in any step argument
    [[step]] name = "convert-rope", run = ["convert", "--out", "{root}/eva-rope-0"], about = "why", needs = ["prepare"]
    [summary] title = "...", [[summary.table]], [[summary.goal]]   # its report (launcher/study_report.py)

A study is a list of `evalm` commands a question needs (a conversion, its training, its evaluations),
run by `launcher.study` as the main job runs its stages: each step once, skipped when done with the same
command, resumable. `evalm run` tells a study from the main job's run file by its top section
(`[study]` vs `[run]`). Every mistake is one line naming the file and the key: an unknown key, a step
name given twice, a `needs` naming an unknown or later step, a command `evalm` does not have.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import field
from pathlib import Path

from pydantic.dataclasses import dataclass

from evalm.config_toolkit import FROZEN, ConfigError, apply_overrides, build, check_sections, read_toml
from evalm.launcher.commands import COMMANDS
from evalm.launcher.study_report import Summary, declared

STEP_NAME = re.compile(r"[a-z0-9-]+")
VAR_NAME = re.compile(r"[a-z0-9_]+")
ROOT_SLOT = "{root}"


@dataclass(config=FROZEN, frozen=True)
class StudySection:
    """`[study]`: what the study is called and where it writes."""

    name: str
    """The study's name (printed, recorded in each step's marker)."""
    root: str
    """Its folder; `{root}` in any step argument is replaced by it; `--root DIR` moves it."""
    about: str = ""
    """One line: what the study asks."""
    vars: dict[str, str | int | float] = field(default_factory=dict)
    """Named values a step argument may hold as `{name}` (after `{root}`): the scale of a study (a model folder,
    its line length, steps, lengths) in one place, changed with `--set study.vars.NAME=VALUE`, so the same file
    runs at another scale (the tests run a GPU study's file on a tiny model)."""

    def __post_init__(self):
        bad = [k for k in self.vars if not VAR_NAME.fullmatch(k) or k == "root"]
        if bad:
            raise ValueError(f"vars {bad}: names are [a-z0-9_]+, and `root` is the study's folder")


@dataclass(config=FROZEN, frozen=True)
class StepSection:
    """`[[step]]`: one `evalm` command of the study."""

    name: str
    """Unique in the study, `[a-z0-9-]+`: what `--only` and `--from` name, and its log's name."""
    run: list[str]
    """The `evalm` command line without `evalm`, e.g. ["eval", "ppl", "--out", "{root}/ppl"]."""
    about: str = ""
    """Why this step."""
    needs: list[str] | None = None
    """Steps that must be done first (default: the previous step)."""

    def __post_init__(self):
        if not STEP_NAME.fullmatch(self.name):
            raise ValueError(f"name {self.name!r}: use lowercase letters, digits and '-' only")
        if not self.run:
            raise ValueError(f"step {self.name!r}: run is empty; give an `evalm` command, e.g. [\"convert\", ...]")


@dataclasses.dataclass(frozen=True)
class StudyStep:
    """A step as it runs: its argv with `{root}` replaced, and the steps it needs."""

    name: str
    argv: list[str]
    needs: tuple[str, ...] = ()
    about: str = ""


@dataclasses.dataclass(frozen=True)
class Study:
    """A validated study file: its section, its folder and its steps in file order."""

    path: Path
    section: StudySection
    root: Path
    steps: tuple[StudyStep, ...] = field(default_factory=tuple)
    summary: Summary | None = None
    """Its report's tables and goals (`launcher.study_report`), None without a [summary]."""

    def step(self, name: str) -> StudyStep:
        return next(s for s in self.steps if s.name == name)

    def names(self) -> list[str]:
        return [s.name for s in self.steps]


def is_study(path: str | Path) -> bool:
    """Whether the run file at `path` is a study (`[study]`) rather than the main job's run file."""
    return "study" in read_toml(path)


def load_study(path: str | Path, overrides: Sequence[str] = (), root: str | None = None) -> Study:
    """Read and check a study file; `overrides` are `study.KEY=VALUE`, `root` moves its folder."""
    raw = apply_overrides(read_toml(path), overrides)
    check_sections(raw, ("study", "step", "summary"), str(path))
    section = build(StudySection, raw.get("study"), where=f"{path} [study]")
    if root is not None:
        section = dataclasses.replace(section, root=root)
    tables = raw.get("step", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{path}: step must be an array of tables, [[step]]")
    if not tables:
        raise ConfigError(f"{path}: no [[step]]; a study needs at least one")
    built = [build(StepSection, t, where=f"{path} [[step]] {i} ({t.get('name', '?')})") for i, t in enumerate(tables, 1)]
    summary = declared(raw.get("summary"), lambda text: substitute(text, section), str(path))
    return Study(Path(path), section, Path(section.root), tuple(_steps(path, built, section)), summary)


def substitute(argument: str, section: StudySection) -> str:
    """`{root}`, then each `{name}` of `vars`, replaced in one step argument (other braces are the command's own,
    e.g. a template's `{label}`); a var's value may itself name `{root}`."""
    argument = argument.replace(ROOT_SLOT, section.root)
    for name, value in section.vars.items():
        argument = argument.replace("{" + name + "}", str(value).replace(ROOT_SLOT, section.root))
    return argument


def _steps(path: str | Path, built: list[StepSection], section: StudySection) -> list[StudyStep]:
    seen: list[str] = []
    steps = []
    for i, s in enumerate(built, 1):
        where = f"{path} [[step]] {i} ({s.name})"
        if s.name in seen:
            raise ConfigError(f"{where}: name {s.name!r} is given twice; each step needs its own name")
        needs = tuple(s.needs) if s.needs is not None else tuple(seen[-1:])
        later = [n for n in needs if n not in seen]
        if later:
            raise ConfigError(f"{where}: needs {later}: no such step before this one; valid: {seen}")
        if s.run[0] not in COMMANDS:
            raise ConfigError(f"{where}: run {s.run[0]!r} is not an `evalm` command; valid: {list(COMMANDS)}")
        seen.append(s.name)
        steps.append(StudyStep(s.name, [substitute(a, section) for a in s.run], needs, s.about))
    return steps
