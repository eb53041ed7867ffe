"""Stage markers of `evalm run`: `ROOT/NAME/STAGE/.evalm-stage.json`, written last when a stage completes.

A marker holds the stage's key (`launcher.keys.stage_key`), the commands it ran, its seconds and the
peak memory so far; a rerun skips a stage whose marker has the same key and is not stale, and the
report reads the run's time and memory back from the markers.
"""

from __future__ import annotations

import json
import resource
from collections.abc import Sequence

from evalm.launcher.run_file import Run

MARKER = ".evalm-stage.json"


def read_marker(r: Run, stage: str) -> dict | None:
    path = r.stage_dir(stage) / MARKER
    return json.loads(path.read_text()) if path.is_file() else None


def write_marker(r: Run, stage: str, marker: dict) -> None:
    (r.stage_dir(stage) / MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def mark_stale(r: Run, stages: Sequence[str]) -> None:
    """After `--only X`, the stages after X were built on X's old outputs: the next run redoes them."""
    for stage in stages:
        marker = read_marker(r, stage)
        if marker is not None:
            write_marker(r, stage, {**marker, "stale": True})


def peak_rss_gib() -> float:
    """Peak resident memory of this process and of the largest finished child (datatrove workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 2**20
