"""The progress line of `evalm eval`: time left before any unit ends (long recall units).

    python -m pytest tests/icl_eval/test_progress.py -q

Recall runs one unit per (family, length, seed), each `--items` items long: at 65,536 tokens on a CPU a unit
is an hour, so a line that counts time left in units says "?" for that hour. With `per_unit`, the estimate
comes from items, and it must be the arithmetic of the items done against those of the units left.
"""

from __future__ import annotations

import re

import pytest

from evalm.icl_eval.protocol import units as units_module
from evalm.icl_eval.protocol.units import Progress, UnitStore, World
from evalm.storage.run_folder import RunFolder


def _store(tmp_path) -> UnitStore:
    store = UnitStore(RunFolder(tmp_path / "run", "evalm eval recall"), {"command": "recall"}, False, World())
    store.prepare()
    return store


def _left(line: str) -> str:
    return re.search(r"items/s\s+(\S+) left", line).group(1)


@pytest.mark.parametrize("per_unit", [3, None])
def test_time_left_counts_items_before_the_first_unit_ends(tmp_path, capsys, monkeypatch, per_unit):
    now = [1000.0]
    monkeypatch.setattr(units_module.time, "time", lambda: now[0])
    progress = Progress(_store(tmp_path), total=4, resumed=1, label="evalm eval recall", unit="items",
                        per_unit=per_unit)
    now[0] = 1012.0
    progress.tick(2)  # two items in 12 s: the progress file is written and the line printed
    line = capsys.readouterr().err
    assert "units 0/4 (1 resumed)  2 items" in line
    if per_unit:  # 3 units to compute x 3 items = 9, 2 done in 12 s: 7 left at 6 s an item = 42 s
        assert _left(line) == "0:00:42"
    else:  # no unit has ended: nothing to count by
        assert _left(line) == "?"


def test_a_grid_of_uneven_units_does_not_claim_to_be_done(tmp_path, capsys, monkeypatch):
    """`evalm eval icl`'s cells hold unequal items (methods, budgets, short test splits): its grid counts time left
    in units, "?" before the first ends, never the "0:00:00 left" that one item a unit gave after a few items."""
    from evalm.icl_eval.protocol.skeleton import Grid

    now = [1000.0]
    monkeypatch.setattr(units_module.time, "time", lambda: now[0])
    grid = Grid(_store(tmp_path), [f"{i:05d}-cell" for i in range(10)], "evalm eval icl")
    now[0] = 1012.0
    grid.progress.tick(7)
    assert _left(capsys.readouterr().err) == "?"
