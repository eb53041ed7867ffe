"""The run file of a study: `[study]` and its `[[step]]`s, validated (`evalm run --config configs/study-NAME.toml`).

    [study] name = "convert-smollm2", root = "runs/convert-smollm2", about = "what the study asks"
    [study.vars] seq_len = 8192                         # `{seq_len}` in any step argument
    [[step]] name = "convert-rope", run = ["convert", "--out", "{root}/eva-rope-0"], about = "why", needs = ["prepare"]
    [summary] title = "...", [[summary.table]], [[summary.goal]]   # its report (launcher/study_report.py)

A study is a list of `evalm` commands a question needs (a conversion, its training, its evaluations),
run by the runner that runs the main job's stages (`launcher.runner`, through `launcher.study`): each
step once, skipped when done with the same command and the same steps before it, resumable. `evalm run`
tells a study from the main job's run file by its top section (`[study]` vs `[run]`). Every mistake is
one line naming the file and the key: an unknown key, a step name given twice, a `needs` naming an
unknown or later step, a command `evalm` does not have, an empty root, two steps writing one `--out`,
a `{name}` that is neither `{root}` nor a var (write `{{name}}` for a literal `{name}`, e.g. a
template's `{label}`), a `--set study.vars.NAME` the file does not declare (or `--set study.vars=...`,
which would replace them all).

A var whose name looks like a credential (pass, pw, secret, token, key) or whose value is a URL with a
password is masked (`***`) wherever a step's command is recorded or shown: its marker, its log, the
console, `--list`; the folder's lock masks it on the command line (`storage.secrets`).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence
from dataclasses import field
from pathlib import Path

from pydantic.dataclasses import dataclass

from evalm.config_toolkit import FROZEN, ConfigError, apply_overrides, build, check_overrides, check_sections, read_toml
from evalm.launcher.commands import COMMANDS
from evalm.launcher.study_report import Summary, declared
from evalm.storage.secrets import MASK, looks_secret, redact_argv

STEP_NAME = re.compile(r"[a-z0-9-]+")
VAR_NAME = re.compile(r"[a-z0-9_]+")
ROOT_SLOT = "{root}"
SLOT = re.compile(r"\{\{(?P<literal>[a-z0-9_]+)\}\}|\{(?P<name>[a-z0-9_]+)\}")
"""`{name}` in a step argument, a var; `{{name}}`, the literal text `{name}` (a template's `{label}`)."""
OUTPUTS = ("--out", "--output")
"""The flags by which a step names the folder or file it writes: no two steps may name the same one."""


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
        if not self.root.strip():
            raise ValueError("root is empty: every `{root}/x` would be `/x`; give the study's folder")


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
    """A step as it runs: its argv with `{root}` and the vars replaced, the steps it needs, and its argv as
    recorded and shown (`shown`: secret-looking vars masked, URL passwords too)."""

    name: str
    argv: list[str]
    needs: tuple[str, ...] = ()
    about: str = ""
    shown: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Study:
    """A validated study file: its section, its folder and its steps in file order."""

    path: Path
    section: StudySection
    root: Path
    steps: tuple[StudyStep, ...] = field(default_factory=tuple)
    summary: Summary | None = None
    """Its report's tables and goals (`launcher.study_report`), None without a [summary]."""

    def __post_init__(self):
        object.__setattr__(self, "_by_name", {s.name: s for s in self.steps})

    def step(self, name: str) -> StudyStep:
        return self._by_name[name]

    def names(self) -> list[str]:
        return [s.name for s in self.steps]


def load_study(path: str | Path, overrides: Sequence[str] = (), root: str | None = None, raw: dict | None = None
               ) -> Study:
    """Read and check a study file (`raw`: its tables, when the caller has read it); `overrides` are
    `study.KEY=VALUE`, `root` moves its folder."""
    raw = read_toml(path) if raw is None else raw
    _check_overrides(path, raw, overrides)
    raw = apply_overrides(raw, overrides)
    check_sections(raw, ("study", "step", "summary"), str(path))
    section = build(StudySection, raw.get("study"), where=f"{path} [study]")
    if root is not None:
        if not root.strip():
            raise ConfigError(f"{path}: --root is empty: every `{{root}}/x` would be `/x`; give the study's folder")
        section = dataclasses.replace(section, root=root)
    tables = raw.get("step", [])
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{path}: step must be an array of tables, [[step]]")
    if not tables:
        raise ConfigError(f"{path}: no [[step]]; a study needs at least one")
    built = [build(StepSection, t, where=f"{path} [[step]] {i} ({t.get('name', '?')})") for i, t in enumerate(tables, 1)]
    names = values(section)[0]
    summary = declared(raw.get("summary"), lambda text: substitute(text, names, f"{path} [summary]"), str(path))
    return Study(Path(path), section, Path(section.root), tuple(_steps(path, built, section)), summary)


def _check_overrides(path: str | Path, raw: dict, overrides: Sequence[str]) -> None:
    """A `--set` is the flag's mistake when it names no key of [study] or a var the file does not declare (it
    would be ignored), or replaces every var at once (`--set study.vars={}` wiped them)."""
    check_overrides(overrides, {"study": StudySection})
    section = raw.get("study")
    declared = section.get("vars", {}) if isinstance(section, dict) else {}
    valid = sorted(declared) if isinstance(declared, dict) else []
    for item in overrides:
        dotted = item.partition("=")[0].strip()
        if dotted == "study.vars":
            raise ConfigError(f"--set study.vars=...: it would replace every var of {path}; set one at a time, "
                              f"--set study.vars.NAME=VALUE; valid: {valid}")
        name = dotted.removeprefix("study.vars.")
        if name != dotted and name not in valid:
            raise ConfigError(f"--set study.vars.{name}: {path} declares no var {name!r} (it would be ignored); "
                              f"valid: {valid}")


def values(section: StudySection) -> tuple[dict[str, str], dict[str, str]]:
    """What each `{name}` stands for, as run and as recorded: `{root}` and the vars (a var's value may name
    `{root}`); a secret-looking var is `***` as recorded."""
    run = {"root": section.root, **{k: str(v).replace(ROOT_SLOT, section.root) for k, v in section.vars.items()}}
    shown = {k: MASK if k != "root" and looks_secret(k, v) else v for k, v in run.items()}
    return run, shown


def substitute(argument: str, names: dict[str, str], where: str = "") -> str:
    """`{name}` replaced by its value in one step argument, `{{name}}` by the literal `{name}`; an unknown `{name}`
    (a misspelled var: it made a folder named `{subb}`) is refused."""
    def slot(match: re.Match) -> str:
        if match["literal"]:
            return "{" + match["literal"] + "}"
        if match["name"] not in names:
            raise ConfigError(f"{where}: {{{match['name']}}} in {argument!r} is no var of the study; valid: "
                              f"{sorted(names)} (write {{{{{match['name']}}}}} for the literal text)")
        return names[match["name"]]

    return SLOT.sub(slot, argument)


def _outputs(argv: Sequence[str]) -> list[str]:
    """The paths a command names after `--out` / `--output` (either form)."""
    found = [b for a, b in zip(argv, argv[1:]) if a in OUTPUTS]
    found += [a.split("=", 1)[1] for a in argv if a.split("=", 1)[0] in OUTPUTS and "=" in a]
    return [os.path.normpath(p) for p in found]


def _steps(path: str | Path, built: list[StepSection], section: StudySection) -> list[StudyStep]:
    run, shown = values(section)
    seen: set[str] = set()
    last: tuple[str, ...] = ()
    writer: dict[str, str] = {}
    steps = []
    for i, s in enumerate(built, 1):
        where = f"{path} [[step]] {i} ({s.name})"
        if s.name in seen:
            raise ConfigError(f"{where}: name {s.name!r} is given twice; each step needs its own name")
        needs = tuple(s.needs) if s.needs is not None else last
        later = [n for n in needs if n not in seen]
        if later:
            raise ConfigError(f"{where}: needs {later}: no such step before this one; valid: the steps above it")
        if s.run[0] not in COMMANDS:
            raise ConfigError(f"{where}: run {s.run[0]!r} is not an `evalm` command; valid: {list(COMMANDS)}")
        argv = [substitute(a, run, where) for a in s.run]
        for out in _outputs(argv):
            if out in writer:
                raise ConfigError(f"{where}: steps {writer[out]!r} and {s.name!r} both write {out} (--out); each "
                                  "would overwrite the other's output: give each step its own")
            writer[out] = s.name
        recorded = tuple(redact_argv(substitute(a, shown, where) for a in s.run))
        seen.add(s.name)
        last = (s.name,)
        steps.append(StudyStep(s.name, argv, needs, s.about, recorded))
    return steps
