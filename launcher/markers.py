"""Stage markers of `evalm run`'s main job: `ROOT/NAME/STAGE/.evalm-stage.json`, written last when a stage completes.

A marker holds the stage's key (`launcher.runner`, with `launcher.keys.stage_inputs`), the commands it ran,
its seconds and the peak memory so far; the runner skips a stage whose marker has the same key and is not
stale, and the report reads the run's time and memory back from the markers. It is what lets `evalm run`
delete a stage folder it made (`discard_stage`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from evalm.launcher.run_file import Run
from evalm.storage import NotOurs, guard_inputs, made_by

MARKER = ".evalm-stage.json"


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

