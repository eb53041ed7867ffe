"""The one runner of `evalm run`: the main job's stages and a study's steps, each done once, by one meaning of done.

A run file is a list of units in order (the main job's stages, `launcher.stages`; a study's steps,
`launcher.study_file`), each with its commands and the units whose outputs it reads (`needs`). A unit's
**key** hashes its commands (the study's secret-looking vars masked), the content of the settings files
they name (the main job's: `launcher.keys`) and the keys of the units it needs. A unit is **done** when its
marker holds that key and is not marked stale; a rerun skips it, and runs every other unit, with every
unit after it that needs it (a changed unit changes the key of its readers: they rerun too).

- `--from NAME` reruns that unit and every later one; `--only A,B` reruns just those and marks the units
  that read them stale (the next plain run redoes them). The units either needs outside the selection must
  be done.
- `--list` prints every unit, its state and its commands; nothing runs.

What differs between the two kinds of run file is the job (`launcher.run.MainJob`, `launcher.study.StudyJob`):
where a unit's marker lives, what is cleared before a unit reruns (a stage's folder; a study step's
commands resume or refuse on their own), how its steps are started (several at once; one after another
with their output on the console) and what its end line says.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from evalm.config_toolkit import ConfigError
from evalm.storage import read_json, redact_argv, redact_value, write_json

DONE, CHANGED, STALE, TODO = "done", "changed", "stale", "to run"


@dataclass(frozen=True)
class Choice:
    """What one `evalm run` invocation asks of its job: which units (`--only` / `--from`), or only their
    listing (`--list`), or (a study) only its report (`--summary`)."""

    only: str | None = None
    start: str | None = None
    listing: bool = False
    summary: bool = False


@dataclass(frozen=True)
class Step:
    """One command: a name unique in the run (also its log's name), its argv, the names of the steps it reads
    outputs of (a step of a unit that is done already counts as done), and its argv as recorded and shown
    (`shown`: a study's secret-looking vars masked; default: the argv with URL passwords masked)."""

    name: str
    argv: list[str]
    needs: tuple[str, ...] = ()
    shown: tuple[str, ...] | None = None

    def record(self) -> list[str]:
        return list(self.shown) if self.shown is not None else redact_argv(map(str, self.argv))


@dataclass(frozen=True)
class Unit:
    """What is done or not: a stage of the main job or a step of a study."""

    name: str
    steps: tuple[Step, ...]
    needs: tuple[str, ...]
    marker: Path
    """Its marker file, written last when its steps have all succeeded."""
    commands: tuple[Sequence[str], ...]
    """What its key hashes of its commands (the argvs, or a study's as recorded)."""
    inputs: Mapping[str, str | None] = field(default_factory=dict)
    """Identities of the settings files its commands read (launcher.keys)."""


def unit_key(commands: Sequence[Sequence[str]], inputs: Mapping[str, str | None], needed: Sequence[str]) -> str:
    """The key of a unit: its commands, its inputs and the keys of the units it needs (one need: the main job's
    chain of stages, the previous stage's key)."""
    blob = json.dumps({"commands": [list(c) for c in commands], "inputs": dict(inputs), "previous": " ".join(needed)},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


class Job(Protocol):
    """What `Runner` needs of a kind of run file."""

    noun: str
    """"stage" or "step"."""
    path: Path
    """The run file."""
    folder: Path
    """The run folder (where the markers say what is done)."""
    command: str
    """The command that runs it again (for messages)."""
    units: Sequence[Unit]

    def clear(self, unit: Unit, why: str) -> None: ...
    """Before `unit` reruns; `why` is "forced", "changed", "stale", "needs" or "new"."""

    def begin(self, unit: Unit, position: str) -> None: ...

    def log(self, step: Step) -> Path: ...

    def execute(self, steps: Sequence[Step], started: Callable[[Step], None],
                finished: Callable[[Step, float], None]) -> None: ...

    def extra(self, unit: Unit) -> dict: ...
    """Fields its marker holds beside the key, commands and seconds."""

    def finish(self, unit: Unit, position: str, seconds: float) -> None: ...


def read_marker(path: Path) -> dict | None:
    """A unit's marker; a bare list is the argv marker of the study runner before keys (its one command)."""
    if not path.is_file():
        return None
    marker = read_json(path, "a done marker")
    return {"commands": [marker]} if isinstance(marker, list) else marker if isinstance(marker, dict) else None


def write_marker(path: Path, marker: dict) -> None:
    """A unit's marker, whole or not at all, its commands redacted (a `--redis-url` password is not recorded)."""
    write_json(path, redact_value(marker))


class Runner:
    """Plans and runs the units of one job."""

    def __init__(self, job: Job):
        self.job = job
        self.units = list(job.units)
        self.order = {u.name: i for i, u in enumerate(self.units)}
        self.by_name = {u.name: u for u in self.units}
        self.keys: dict[str, str] = {}
        for u in self.units:  # file order: a unit's needs come before it
            self.keys[u.name] = unit_key(u.commands, u.inputs, [self.keys[n] for n in u.needs])
        self.markers = {u.name: read_marker(u.marker) for u in self.units}
        self.ran: set[str] = set()
        """The units this invocation ran."""

    def state(self, name: str) -> str:
        marker, unit = self.markers[name], self.by_name[name]
        if marker is None:
            return TODO
        if marker.get("stale"):
            return STALE
        if "key" in marker:
            return DONE if marker["key"] == self.keys[name] else CHANGED
        recorded = [redact_argv(map(str, c)) for c in unit.commands]
        return DONE if marker.get("commands") == recorded else CHANGED  # before keys: same argv

    def select(self, only: str | None, start: str | None) -> tuple[list[Unit], bool]:
        """The units this invocation considers, and whether they rerun even when done (`--only` / `--from`)."""
        job, names = self.job, list(self.by_name)
        asked = [n.strip() for n in only.split(",")] if only else [start] if start else []
        unknown = [n for n in asked if n not in self.by_name]
        if unknown:
            flag = "--only" if only else "--from"
            raise ConfigError(f"{job.path}: {flag} {unknown}: no such {job.noun}; valid: {names}")
        if not asked:
            return list(self.units), False
        chosen = [u for u in self.units if u.name in asked] if only else self.units[self.order[start]:]
        inside = {u.name for u in chosen}
        for unit in chosen:
            missing = [n for n in unit.needs if n not in inside and self.state(n) != DONE]
            if missing:
                raise ConfigError(f"{job.folder}: {job.noun} {unit.name!r} needs {missing}, not done; run "
                                  f"`{job.command}` first (or name them too)")
        return chosen, True

    def listing(self) -> str:
        """`--list`: every unit, its state and its commands."""
        lines = []
        for unit in self.units:
            commands = [" ".join(s.record()) for s in unit.steps] or ["(nothing to run)"]
            lines.append(f"  {unit.name:<28} {self.state(unit.name):<8} evalm {commands[0]}")
            lines += [f"  {'':<28} {'':<8} evalm {c}" for c in commands[1:]]
        return "\n".join(lines)

    def run(self, only: str | None = None, start: str | None = None) -> dict[str, float]:
        """Run what is not done among the selected units; returns each selected unit's seconds (0: skipped)."""
        chosen, forced = self.select(only, start)
        job, rerun, planned = self.job, set(), {}
        seconds = dict.fromkeys((u.name for u in chosen), 0.0)
        for i, unit in enumerate(chosen, 1):
            position, now = f"{i}/{len(chosen)}", self.state(unit.name)
            needs = any(n in rerun for n in unit.needs)
            if now == DONE and not forced and not needs:
                ran = (self.markers[unit.name] or {}).get("seconds")
                when = f" ({ran:.0f} s when it ran)" if isinstance(ran, (int, float)) else ""
                print(f"{job.noun} {position} {unit.name}: complete, skipped{when}", flush=True)
                continue
            why = "forced" if forced else "needs" if needs else {CHANGED: "changed", STALE: "stale", TODO: "new"}[now]
            said = {"changed": "its settings or inputs changed; redoing it", "stale": "marked stale by --only; redoing it",
                    "needs": f"a {job.noun} it needs is redone; redoing it too"}.get(why)
            if said and now != TODO:
                print(f"{job.noun} {position} {unit.name}: {said}", flush=True)
            job.clear(unit, why)
            unit.marker.unlink(missing_ok=True)
            rerun.add(unit.name)
            planned[unit.name] = position
        seconds |= _Progress(self, planned).run()
        self.ran = set(planned)
        if only:
            self.mark_stale(self.readers({u.name for u in chosen}) - {u.name for u in chosen})
        return seconds

    def readers(self, names: set[str]) -> set[str]:
        """Every unit that reads, directly or through others, one of `names`."""
        found = set(names)
        for unit in self.units:  # file order: a reader comes after what it reads
            if any(n in found for n in unit.needs):
                found.add(unit.name)
        return found - names

    def mark_stale(self, names: set[str]) -> None:
        """After `--only`, the units that read what it reran were built on the old outputs: the next run redoes them."""
        for name in sorted(names, key=self.order.get):
            marker = read_marker(self.by_name[name].marker)
            if marker is not None:
                write_marker(self.by_name[name].marker, {**marker, "stale": True})


class _Progress:
    """The units one invocation runs, from their steps' start and end: the first step of a unit begins it, the
    last writes its marker (its key, commands as recorded, the seconds its steps ran, summed: steps of several
    units may run at once, so the invocation's wall is less)."""

    def __init__(self, runner: Runner, planned: dict[str, str]):
        self.runner, self.job, self.planned = runner, runner.job, planned
        self.units = [runner.by_name[n] for n in planned]
        self.unit_of = {s.name: u for u in self.units for s in u.steps}
        self.left = {u.name: len(u.steps) for u in self.units}
        self.seconds = dict.fromkeys(planned, 0.0)
        self.begun: set[str] = set()

    def started(self, step: Step) -> None:
        unit = self.unit_of[step.name]
        if unit.name not in self.begun:
            self.begun.add(unit.name)
            self.job.begin(unit, self.planned[unit.name])

    def finished(self, step: Step, seconds: float) -> None:
        unit = self.unit_of[step.name]
        self.seconds[unit.name] += seconds
        self.left[unit.name] -= 1
        if not self.left[unit.name]:
            self._complete(unit)

    def _complete(self, unit: Unit) -> None:
        seconds = self.seconds[unit.name]
        marker = {self.job.noun: unit.name, "key": self.runner.keys[unit.name],
                  "commands": [s.record() for s in unit.steps], "seconds": seconds, **self.job.extra(unit)}
        write_marker(unit.marker, marker)
        self.job.finish(unit, self.planned[unit.name], seconds)

    def run(self) -> dict[str, float]:
        for unit in [u for u in self.units if not u.steps]:  # a unit with nothing to do (the main job's twins off)
            self.job.begin(unit, self.planned[unit.name])
            self._complete(unit)
        self.job.execute([s for u in self.units for s in u.steps], self.started, self.finished)
        return self.seconds

