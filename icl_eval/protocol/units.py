"""Evaluation as units of work: sharded over `torchrun` ranks, kept as each finishes, merged in order.

A unit is work that shares one demonstration cache: for `evalm eval icl` one draw seed x split x
shots (or budget) cell with every method, order and arm in it (`protocol.Runner.units`); for
`evalm eval ppl` one book. Rank r of N takes the units i with i = r (mod N), one model per rank on
its own device (`cuda:LOCAL_RANK`, or the CPU). Without `torchrun` the same code is a world of one.

Each finished unit is written to OUT/units/NAME.npz whole or not at all (`storage.files.replaced`),
whatever kills the process. `key.json` holds what the units were computed from, by content: the
command's effective settings, the task's definition (template, labels, every field), the data files,
the model's weights and tokenizer by their SHA-256 (`RunFolder.identity`, cached by `stat`, so an
edited task file or weights copied over the old ones are seen, a `touch -r` included). A rerun with
the same key skips the units already there (a damaged one, which an atomic write never leaves, is
named and computed again) and redoes the rest; a rerun with another key is refused, naming what
changed, unless `--overwrite` discards them (only a units folder this command made, never an input:
`RunFolder.discard`). Rank 0 waits for every unit file, then merges them in the one-process order, so
results.json is the one-process file whatever the number of ranks: per-item records are computed per
unit and every statistic over them (means, the bootstrap with its fixed seed) is computed after the merge.

Progress: every rank writes OUT/units/progress/rank-R.json (units and items done); rank 0 prints
one line from all of them: units done / total, items per second, time left.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import sys
import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from evalm.config_toolkit import ConfigError
from evalm.storage import DamagedFile, Ranks, RunFolder, SettingsChanged, replaced, write_atomic
from evalm.storage.files import temporaries
from evalm.storage.settings import as_read_back, differences, flatten

WAIT = datetime.timedelta(hours=72)
"""Timeout of the start-up collectives: rank 0 may load a large model long after the others."""
POLL_SECONDS = 1.0
PRINT_SECONDS = 10.0
"""Rank 0 prints a progress line at most this often (and at each unit it finishes)."""
META = "__meta__"
KEY = "units/key.json"


def _broadcast(box: list) -> None:
    import torch.distributed as dist

    dist.broadcast_object_list(box, src=0)


@dataclass(frozen=True)
class World:
    """This process's place among the `torchrun` ranks (a world of one without torchrun)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    def device(self, configured: str) -> str:
        """The rank's device: `cuda` becomes `cuda:LOCAL_RANK` (one model per GPU); anything else is kept."""
        if configured == "cuda" and self.size > 1:
            return f"cuda:{self.local_rank}"
        return configured

    @property
    def ranks(self) -> Ranks:
        return Ranks(self.rank, self.size, _broadcast if self.size > 1 else None)

    def share(self, fn: Callable[[], Any]) -> Any:
        """`fn()` on rank 0, its value or its error (a user error kept one, a bug a bug) on every rank
        (`storage.ranks.Ranks.share`)."""
        return self.ranks.share(fn)

    def close(self) -> None:
        if self.size > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


def join(configured_device: str) -> World:
    """Join the `torchrun` process group when WORLD_SIZE > 1 (gloo on CPU, NCCL on GPU), else a world of one."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return World()
    import torch
    import torch.distributed as dist

    world = World(int(os.environ["RANK"]), size, int(os.environ.get("LOCAL_RANK", "0")))
    cuda = configured_device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(world.local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", timeout=WAIT)
    return world


def run_folder(folder: str | Path, command: str, world: World, inputs: Sequence = ()) -> RunFolder:
    """The evaluation's output folder, held by rank 0 alone for every rank (a lock per rank would
    refuse the other ranks): `with run_folder(...).held() as folder:`; never one of `inputs` (the model
    it reads, its task and data) nor inside one."""
    return RunFolder(folder, command, world.ranks, inputs=[i for i in inputs if i])


# ---------------------------------------------------------------- resume keys, by content


def icl_key(model, folder: RunFolder, settings: dict, task, data_info: dict) -> dict[str, Any]:
    """What `evalm eval icl`'s units are computed from: the settings, the task's definition (template,
    labels, every field), the data by the content of its files, the model (a `models.source.ModelSource`)
    by its weights."""
    splits = data_info.get("splits", {})
    data_files = {split: folder.identity(path) for split, path in splits.items() if Path(str(path)).exists()}
    source = data_info.get("source")
    if not data_files and source and Path(str(source)).exists():  # the splits live inside it (a saved DatasetDict)
        data_files = {"source": folder.identity(source)}
    return {"command": "icl", "settings": settings, "task": dataclasses.asdict(task), "model": model.key(folder),
            "data": data_info, "data_files": data_files}


def icl_inputs(model, task_flag: str | None, data_info: dict) -> list:
    """The files `evalm eval icl` reads (`model` a `models.source.ModelSource`), which `--overwrite` must never delete."""
    return [*model.inputs(), task_flag, data_info.get("source"), *data_info.get("splits", {}).values()]


def ppl_key(model, folder: RunFolder, settings: dict, config) -> dict[str, Any]:
    """What `evalm eval ppl`'s units are computed from: the settings, the books and unigram shards by content,
    the model by its weights (a book id of the datasets cache by its name)."""
    unigram = folder.identity(config.unigram_shards) if config.unigram_shards else None
    return {"command": "ppl", "settings": settings, "model": model.key(folder),
            "books": books_key(folder, config.books), "unigram": unigram}


def books_key(folder: RunFolder, books: Sequence) -> dict[str, str]:
    """Books by content where they are files or folders, by name where they are a datasets-cache id."""
    on_disk = [b for b in books if Path(str(b)).exists()]
    return {**{str(b): str(b) for b in books}, **dict(zip(map(str, on_disk), folder.identities(on_disk)))}


def ppl_inputs(model, config) -> list:
    return [*model.inputs(), *config.books, config.unigram_shards]


EXECUTION = {"seconds", "seconds_per_item", "seconds_per_item_mean", "seconds_per_item_std", "encode_seconds",
             "marginal_seconds_per_item", "execution"}
"""Fields that say how long the run took or how it ran (ranks, resumed units), not what it measured:
the only fields in which a results.json merged from N ranks may differ from the one-process file."""


def without_execution(value: Any) -> Any:
    """`value` (a results.json's content) with every EXECUTION field removed, at any depth."""
    if isinstance(value, dict):
        return {k: without_execution(v) for k, v in value.items() if k not in EXECUTION}
    if isinstance(value, list):
        return [without_execution(v) for v in value]
    return value


def changes(old: Any, new: Any) -> list[str]:
    """Dotted paths where two JSON values differ, with both values."""
    a, b = flatten(old), flatten(new)
    return [f"{k or 'key'}: {json.dumps(a.get(k))} -> {json.dumps(b.get(k))}" for k in differences(old, new)]


class UnitStore:
    """OUT/units: one `.npz` per finished unit (arrays plus `__meta__`, JSON), and the `key.json` they share."""

    def __init__(self, run: RunFolder, key: dict[str, Any], overwrite: bool, world: World, inputs: Sequence = ()):
        self.run, self.key, self.overwrite, self.world = run, as_read_back(key), overwrite, world
        self.folder, self.inputs = run.path / "units", [i for i in inputs if i]
        self.digest = hashlib.sha256(json.dumps(self.key, sort_keys=True).encode()).hexdigest()

    def prepare(self) -> None:
        """On rank 0: refuse (or with --overwrite discard) units of other settings, record the key and clear
        half-written files, before any rank loads a model."""
        self.world.share(self._prepare)

    def finished(self, names: Sequence[str]) -> list[str]:
        """Which of `names` were finished before this run (rank 0 looks while every rank waits for it); a
        damaged unit file is named and removed, so that it is computed again."""
        return self.world.share(lambda: [n for n in names if self.done(n) and self._intact(n)])

    def _prepare(self) -> None:
        self.run.mark("units")
        try:
            self._record()
        except (SettingsChanged, DamagedFile):
            if not self.overwrite:
                raise
            self.run.discard("units", self.inputs)
            self.run.mark("units")
            self._record()
        (self.folder / "progress").mkdir(exist_ok=True)
        progress = self.folder / "progress"
        for stale in [*temporaries(self.folder), *temporaries(progress), *progress.glob("*.json")]:
            stale.unlink()

    def _record(self) -> None:
        self.run.record(KEY, self.key, what="holds units computed with other settings",
                        advice=lambda _: "Rerun with the same settings to resume, or add --overwrite to discard them")

    def path(self, name: str) -> Path:
        return self.folder / f"{name}.npz"

    def done(self, name: str) -> bool:
        return self.path(name).is_file()

    def save(self, name: str, meta: dict[str, Any], arrays: dict[str, np.ndarray] | None = None) -> None:
        """Write the unit whole or not at all (`storage.files.replaced`: a temporary file, then a rename)."""
        blob = json.dumps({"key": self.digest, **meta}, default=_native).encode("utf-8")
        with replaced(self.path(name)) as tmp, open(tmp, "wb") as f:
            np.savez(f, **{META: np.frombuffer(blob, dtype=np.uint8)}, **(arrays or {}))

    def _read(self, name: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        path = self.path(name)
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(data[META].tobytes().decode("utf-8"))
                arrays = {k: data[k] for k in data.files if k != META}
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as err:
            raise DamagedFile(f"{path}: a damaged unit file ({type(err).__name__}: {err}); remove it and rerun "
                              "(it is computed again)") from None
        if not isinstance(meta, dict) or "key" not in meta:
            raise DamagedFile(f"{path}: not a unit file of evalm eval; remove it and rerun (it is computed again)")
        return meta, arrays

    def _intact(self, name: str) -> bool:
        try:
            self._read(name)
        except DamagedFile as err:
            print(f"{err.args[0].split(';')[0]}; computing it again", file=sys.stderr, flush=True)
            self.path(name).unlink()
            return False
        return True

    def load(self, name: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(meta, arrays) of a finished unit; refuses a damaged one and one written under another key."""
        meta, arrays = self._read(name)
        if meta.pop("key") != self.digest:
            raise ConfigError(f"{self.path(name)}: written with other settings than {self.folder}/key.json; "
                              "remove it or rerun with --overwrite")
        return meta, arrays


def _native(value: Any) -> Any:
    """JSON for numpy scalars and arrays (their Python values); anything else as text."""
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    return str(value)


class Progress:
    """Units done / total, items per second and time left, over every rank (rank 0 prints). Where every
    unit holds `per_unit` items, time left is counted in items, so a run of few long units (recall at 64k
    tokens: one unit is an hour) says how long it has left before its first unit ends."""

    def __init__(self, store: UnitStore, total: int, resumed: int, label: str, unit: str = "items",
                 per_unit: int | None = None):
        self.store, self.total, self.resumed, self.label, self.unit = store, total, resumed, label, unit
        self.per_unit = per_unit
        self.t0 = self._last_write = self._last_print = time.time()
        self.units = self.items = 0

    def tick(self, n: int = 1) -> None:
        self.items += n
        if time.time() - self._last_write > 2.0:
            self._write()
        if self.store.world.rank == 0 and time.time() - self._last_print > PRINT_SECONDS:
            self.show()

    def unit_done(self) -> None:
        self.units += 1
        self._write()
        if self.store.world.rank == 0:
            self.show()

    def _write(self) -> None:
        self._last_write = time.time()
        path = self.store.folder / "progress" / f"rank-{self.store.world.rank}.json"
        write_atomic(path, json.dumps({"units": self.units, "items": self.items}))

    def totals(self) -> tuple[int, int]:
        """(units computed in this run, items scored in this run), summed over the ranks' progress files."""
        units = items = 0
        for path in (self.store.folder / "progress").glob("rank-*.json"):
            try:
                row = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):  # being replaced at this moment: next time
                continue
            units, items = units + row["units"], items + row["items"]
        return units, items

    def show(self) -> None:
        self._last_print = time.time()
        units, items = self.totals()
        elapsed = max(time.time() - self.t0, 1e-9)
        done = len(list(self.store.folder.glob("*.npz")))  # the files are the truth
        if self.per_unit and items:
            left = max(0, (self.total - self.resumed) * self.per_unit - items) * elapsed / items
        else:
            left = (self.total - done) * elapsed / units if units else None
        eta = str(datetime.timedelta(seconds=round(left))) if left is not None else "?"
        print(f"{self.label}: units {done}/{self.total} ({self.resumed} resumed)  {items} {self.unit}  "
              f"{items / elapsed:.1f} {self.unit}/s  {eta} left", file=sys.stderr, flush=True)


def run_units(names: Sequence[str], compute: Callable[[int], tuple[dict, dict | None]], store: UnitStore,
              progress: Progress) -> None:
    """This rank's share of the units (i = rank mod size), skipping those already finished; rank 0 then
    waits until every unit's file is there (the other ranks simply end)."""
    world = store.world
    for i, name in enumerate(names):
        if i % world.size != world.rank or store.done(name):
            continue
        meta, arrays = compute(i)
        store.save(name, meta, arrays)
        progress.unit_done()
    if world.rank == 0:
        waited = False
        while not all(store.done(n) for n in names):
            waited = True
            time.sleep(POLL_SECONDS)
            if time.time() - progress._last_print > PRINT_SECONDS:
                progress.show()
        if waited or not progress.units:  # the last line says units total/total
            progress.show()


def execution_record(world, names: list[str], resumed: list[str]) -> dict:
    """How the results were computed (not what they are): ranks, units, units taken from an earlier run."""
    return {"ranks": world.size, "units": len(names), "units_resumed": len(resumed),
            "units_computed": len(names) - len(resumed)}
