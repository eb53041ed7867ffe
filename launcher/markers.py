"""Stage markers of `evalm run`: `ROOT/NAME/STAGE/.evalm-stage.json`, written last when a stage completes.

A marker holds the stage's key (`launcher.keys.stage_key`), the commands it ran, its seconds and the
peak memory so far; a rerun skips a stage whose marker has the same key and is not stale, and the
report reads the run's time and memory back from the markers. A marker is written whole or not at all,
its commands redacted (a `--redis-url` password is not recorded), and it is what lets `evalm run`
delete a stage folder it made (`discard_stage`).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from evalm.launcher.run_file import Run
from evalm.storage import NotOurs, guard_inputs, made_by, read_json, redact_value, write_json

MARKER = ".evalm-stage.json"


def read_marker(r: Run, stage: str) -> dict | None:
    path = r.stage_dir(stage) / MARKER
    return read_json(path) if path.is_file() else None


def write_marker(r: Run, stage: str, marker: dict) -> None:
    write_json(r.stage_dir(stage) / MARKER, redact_value(marker))


def discard_stage(r: Run, stage: str) -> None:
    """Delete a stage's folder to redo the stage, only when `evalm run` made it (its stage marker, or the
    folder marker `evalm run` or a stage command wrote when it created the folder) and it is not, nor holds,
    an input of the run (the samples, the run file): a run file naming a folder of other files as its
    root must not cost them."""
    folder = r.stage_dir(stage)
    if not folder.exists():
        return
    guard_inputs(folder, [r.samples, r.path], "redoing the stage")
    if not ((folder / MARKER).is_file() or made_by(folder) or _empty(folder)):
        raise NotOurs(f"{folder}: evalm run deletes only a stage folder it made, and this one has neither "
                      f"{MARKER} nor a folder marker; move it away or choose another [run] root or name")
    shutil.rmtree(folder)


def _empty(folder: Path) -> bool:
    return not any(folder.iterdir())


def mark_stale(r: Run, stages: Sequence[str]) -> None:
    """After `--only X`, the stages after X were built on X's old outputs: the next run redoes them."""
    for stage in stages:
        marker = read_marker(r, stage)
        if marker is not None:
            write_marker(r, stage, {**marker, "stale": True})

