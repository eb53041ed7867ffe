"""The one skeleton of `evalm eval icl|ppl|recall`: typed settings, a run folder, units over ranks, a report.

Each command turns its flags into one `Invocation` at its edge (`icl_eval.cli`, `icl_eval.recall.command`)
and then runs the same steps, its own work in between:

    return evaluate(run, inputs, body)           # the torchrun world, OUT held by rank 0, the world closed
    def body(folder, world):
        store = open_store(run, folder, world, key, inputs)   # the settings block, the resume key, the units
        ...load the model, check the input...   # every refusal before any unit is scored
        store.prepare()
        grid = Grid(store, names, run.command)
        loaded = grid.run(compute)               # this rank's units; on rank 0 then every unit, in order
        ...report on rank 0...                   # results.json with grid.execution()

`recall` loads its model before `open_store` (its items are checked in the model's tokens before the
settings block), `icl` and `ppl` after; the steps are otherwise the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from evalm.icl_eval.models.source import LoadOptions, ModelSource
from evalm.icl_eval.protocol.units import (Progress, UnitStore, World, execution_record, join, run_folder,
                                           run_units)


@dataclasses.dataclass(frozen=True)
class Invocation:
    """One `evalm eval icl|ppl|recall` command line, typed: what the library receives instead of the parsed flags."""

    command: str
    """`evalm eval icl`, `evalm eval ppl` or `evalm eval recall`: the header of its lines and of its run folder."""
    out: Path
    """--out: the run folder."""
    source: ModelSource
    """The model to score."""
    options: LoadOptions
    """How it is loaded (device, dtype, context window, EVA ablation)."""
    settings: dict[str, Any]
    """The effective settings (`settings.record`): printed before any work, kept in results.json."""
    overwrite: bool = False
    """--overwrite: discard finished units computed with other settings."""
    allow_skip: bool = False
    """--allow-skip: what the data cannot supply is skipped and recorded, not an error."""


def evaluate(run: Invocation, inputs: Sequence, body: Callable[[Any, World], None]) -> int:
    """`body(folder, world)` inside the run folder, held by rank 0 for every rank of the torchrun world."""
    world = join(run.options.device)
    try:
        with run_folder(run.out, run.command, world, inputs).held() as folder:
            body(folder, world)
    finally:
        world.close()
    return 0


def open_store(run: Invocation, folder, world: World, key: Callable[[], dict], inputs: Sequence) -> UnitStore:
    """The settings block on rank 0, then the unit store under the resume key `key()` (rank 0 reads the files)."""
    from evalm.icl_eval.settings import render

    if world.rank == 0:
        print(render(run.command, run.settings), flush=True)
    return UnitStore(folder, folder.share(key), run.overwrite, world, inputs)


class Grid:
    """A command's units by name: the finished ones resumed, the rest computed over the ranks with progress.
    `per_unit`: the items (`unit`s ticked) in each unit where every unit holds as many, so time left counts them;
    None where units differ (icl's cells: methods, budgets, short test splits), so time left counts units."""

    def __init__(self, store: UnitStore, names: list[str], command: str, unit: str = "items",
                 per_unit: int | None = None):
        self.store, self.names = store, names
        self.resumed = store.finished(names)
        self.progress = Progress(store, len(names), len(self.resumed), command, unit=unit, per_unit=per_unit)

    def run(self, compute: Callable[[int], tuple[dict, dict | None]]) -> list[tuple[dict, dict]] | None:
        """This rank's units; on rank 0 then every unit's (meta, arrays) in the one-process order, else None."""
        run_units(self.names, compute, self.store, self.progress)
        if self.store.world.rank != 0:
            return None
        return [self.store.load(name) for name in self.names]

    def execution(self) -> dict:
        """How the grid ran (ranks, resumed units): results.json's `execution`."""
        return execution_record(self.store.world, self.names, self.resumed)
