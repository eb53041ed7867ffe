"""Evaluation as units of work: sharded over `torchrun` ranks, kept as each finishes, merged in order.

A unit is work that shares one demonstration cache: for `evalm eval icl` one draw seed x split x
shots (or budget) cell with every method, order and arm in it (`protocol.Runner.units`); for
`evalm eval ppl` one book. Rank r of N takes the units i with i = r (mod N), one model per rank on
its own device (`cuda:LOCAL_RANK`, or the CPU). Without `torchrun` the same code is a world of one.

Each finished unit is written to OUT/units/NAME.npz under a temporary name and renamed into place
(`os.replace`), so a unit file is either whole or absent, whatever kills the process. The folder's
`key.json` holds the settings the units were computed with (the command's effective settings, the
model's files, the data); a rerun with the same key skips the units already there and redoes the
rest, and a rerun with another key is refused, naming what changed, unless `--overwrite` discards
them. Rank 0 waits for every unit file, then merges them in the one-process order, so results.json
is the one-process file whatever the number of ranks: per-item records are computed per unit and
every statistic over them (means, the bootstrap with its fixed seed) is computed after the merge.

Progress: every rank writes OUT/units/progress/rank-R.json (units and items done); rank 0 prints
one line from all of them: units done / total, items per second, time left.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from evalm.config_toolkit import ConfigError, UserError, is_user_error, note_folder
from evalm.storage import folder_lock

WAIT = datetime.timedelta(hours=72)
"""Timeout of the start-up collectives: rank 0 may load a large model long after the others."""
POLL_SECONDS = 1.0
PRINT_SECONDS = 10.0
"""Rank 0 prints a progress line at most this often (and at each unit it finishes)."""
META = "__meta__"


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

    def share(self, fn: Callable[[], Any]) -> Any:
        """`fn()` run on rank 0 only and its value given to every rank; an error there is raised on every rank
        (the others would otherwise wait for rank 0 forever): rank 0's own, elsewhere its message, as a user
        error when it was one on rank 0 (config_toolkit.is_user_error), else as a bug naming rank 0."""
        error, value = None, None
        if self.rank == 0:
            try:
                value = fn()
            except Exception as err:  # noqa: BLE001 - re-raised below, after the other ranks heard of it
                error = err
        if self.size > 1:
            import torch.distributed as dist

            box = [(None if error is None else (type(error).__name__, str(error), is_user_error(error)), value)]
            dist.broadcast_object_list(box, src=0)
            failure, value = box[0]
            if failure is not None and error is None:
                name, message, user = failure
                raise UserError(message) if user else RuntimeError(f"rank 0 failed with {name}: {message}")
        if error is not None:
            raise error
        return value

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


@contextmanager
def hold(folder: str | Path, command: str, world: World) -> Iterator[None]:
    """The output folder's lock, taken by rank 0 alone (a lock per rank would refuse the other ranks);
    a folder busy with another run is refused on every rank."""
    with ExitStack() as stack:
        world.share(lambda: stack.enter_context(folder_lock(folder, command)) and None)
        try:
            yield
        except Exception as err:
            note_folder(err, folder)  # every rank's bug log goes to FOLDER/logs (only rank 0 holds the lock)
            raise


def stamp(path: str | Path) -> Any:
    """What identifies a model or data file without reading it: size and modification time (of each
    file directly inside, for a folder); None when the path does not exist."""
    path = Path(path)
    if path.is_file():
        st = path.stat()
        return [st.st_size, st.st_mtime_ns]
    if path.is_dir():
        return {p.name: stamp(p) for p in sorted(path.iterdir()) if p.is_file() and not p.name.startswith(".")}
    return None


def _native(value: Any) -> Any:
    """JSON for numpy scalars and arrays (their Python values); anything else as text."""
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    return str(value)


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


def canonical(value: Any) -> Any:
    """`value` as JSON would give it back (tuples as lists, numpy as Python), for comparing keys."""
    return json.loads(json.dumps(value, default=_native, sort_keys=True))


def changes(old: Any, new: Any, where: str = "") -> list[str]:
    """Dotted paths where two JSON values differ, with both values."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += changes(old.get(k), new.get(k), f"{where}.{k}" if where else str(k))
        return out
    return [] if old == new else [f"{where or 'key'}: {json.dumps(old)} -> {json.dumps(new)}"]


class UnitStore:
    """OUT/units: one `.npz` per finished unit (arrays plus `__meta__`, JSON), and the `key.json` they share."""

    def __init__(self, folder: str | Path, key: dict[str, Any], overwrite: bool, world: World):
        self.folder, self.key, self.overwrite, self.world = Path(folder), canonical(key), overwrite, world
        self.digest = hashlib.sha256(json.dumps(self.key, sort_keys=True).encode()).hexdigest()

    def prepare(self) -> None:
        """On rank 0: refuse (or with --overwrite discard) units of other settings, record the key and clear
        half-written files, before any rank loads a model."""
        self.world.share(self._prepare)

    def finished(self, names: Sequence[str]) -> list[str]:
        """Which of `names` were finished before this run (rank 0 looks while every rank waits for it)."""
        return self.world.share(lambda: [n for n in names if self.done(n)])

    def _prepare(self) -> None:
        key_file = self.folder / "key.json"
        if key_file.is_file():
            try:
                old = json.loads(key_file.read_text(encoding="utf-8"))
            except ValueError:
                old = {"key.json": "unreadable"}
            if old != self.key:
                if not self.overwrite:
                    diff = changes(old, self.key)
                    shown = "; ".join(diff[:3]) + (f"; and {len(diff) - 3} more" if len(diff) > 3 else "")
                    raise ConfigError(f"{self.folder}: its finished units were computed with other settings "
                                      f"({shown}); rerun with the same settings to resume, or add --overwrite "
                                      "to discard them")
                shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "progress").mkdir(exist_ok=True)
        for stale in [*self.folder.glob("*.tmp*"), *(self.folder / "progress").glob("*.json")]:
            stale.unlink()
        tmp = key_file.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(self.key, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, key_file)

    def path(self, name: str) -> Path:
        return self.folder / f"{name}.npz"

    def done(self, name: str) -> bool:
        return self.path(name).is_file()

    def save(self, name: str, meta: dict[str, Any], arrays: dict[str, np.ndarray] | None = None) -> None:
        """Write the unit whole or not at all: a temporary file, then `os.replace` (atomic on POSIX)."""
        blob = json.dumps({"key": self.digest, **meta}, default=_native).encode("utf-8")
        tmp = self.folder / f"{name}.npz.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            np.savez(f, **{META: np.frombuffer(blob, dtype=np.uint8)}, **(arrays or {}))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path(name))

    def load(self, name: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(meta, arrays) of a finished unit; refuses one written under another key."""
        with np.load(self.path(name), allow_pickle=False) as data:
            meta = json.loads(data[META].tobytes().decode("utf-8"))
            arrays = {k: data[k] for k in data.files if k != META}
        if meta.pop("key") != self.digest:
            raise ConfigError(f"{self.path(name)}: written with other settings than {self.folder}/key.json; "
                              "remove it or rerun with --overwrite")
        return meta, arrays


class Progress:
    """Units done / total, items per second and time left, over every rank (rank 0 prints)."""

    def __init__(self, store: UnitStore, total: int, resumed: int, label: str, unit: str = "items"):
        self.store, self.total, self.resumed, self.label, self.unit = store, total, resumed, label, unit
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
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"units": self.units, "items": self.items}), encoding="utf-8")
        os.replace(tmp, path)

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
