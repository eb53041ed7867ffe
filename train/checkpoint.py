"""DCP checkpoints that count only once complete.

Layout under a run folder OUT:
    OUT/checkpoints/step-00001000/   a `torch.distributed.checkpoint` folder plus
        config.json                  the run's resolved config (the architecture check reads it)
        .complete                    the marker: written last, so only marked folders count
Every rank writes its shards into `.tmp-step-00001000/`; when DCP's save has returned on all
ranks, rank 0 writes config.json and the marker there and renames the folder into place. A save
killed at any point leaves at most a `.tmp-*` folder (or an unmarked one), never a newer "latest":
the previous complete checkpoint stays what `--resume auto` finds (torchtitan's `.metadata` probe,
nanochat's "manifest written last").

Saved under fixed keys: `model` and `optim` (sharded, via `get_state_dict`), `train` (step, tokens
seen and `lines`, the global line position all ranks reached: the same on every rank), `scheduler` (the step: the LR is a pure function of it), and
`rank_<r>` for each rank's data cursor and RNG states. Plain values must sit under rank keys:
DCP keeps only rank 0's copy of a non-tensor value that every rank saves under the same key.
Loads unpickle non-tensor values with `weights_only=True` (`SafeLoadPlanner`) and the `.metadata`
with an allow-list (`dcp_metadata`): a checkpoint is data, never code.

A marked folder also holds `digest.json` (every file's size and SHA-256, written before the
marker). Before a checkpoint is used it is verified; a damaged latest one is skipped for the newest
intact one, and the caller is told which and why (`newest_intact`). A checkpoint without a digest
(saved before digests, or its digest.json lost) is checked as far as it can be: every item the
metadata lists must lie inside its file and load.

DCP reports a failed save or load as `CheckpointException`, a BaseException: it escapes every
`except Exception`, so a damaged file once ended a run with a raw traceback and no log. A load that
fails is a `CheckpointError` naming the checkpoint; a save that fails raises the error DCP wrapped
(a full or read-only disk is then the user's one line, anything else a bug with its log).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from evalm.config_toolkit import UserError
from evalm.config import architecture_differences
from evalm.storage import read_json, space_error, verify_digest, write_digest
from evalm.storage.digest import DIGEST_FILE
from evalm.train.identity import identity_differences
from evalm.train.dcp_metadata import MetadataReader, SafeLoadPlanner, read_metadata_file, storage_problem

MARKER = ".complete"
STEP_DIR = re.compile(r"^step-(\d{8})$")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be used; the message names it and says what to do."""


def step_dir(out: str | Path, step: int) -> Path:
    return Path(out) / "checkpoints" / f"step-{step:08d}"


def complete_checkpoints(out: str | Path) -> list[Path]:
    """Marked `step-XXXXXXXX` folders of a run, oldest first."""
    root = Path(out) / "checkpoints"
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if STEP_DIR.match(p.name) and (p / MARKER).is_file()]
    return sorted(found, key=lambda p: p.name)


def damage(path: Path) -> str | None:
    """Why a complete checkpoint cannot be used (a file missing, truncated or changed, its metadata
    unreadable or refused, an item that does not load), or None when it is intact."""
    problem = verify_digest(path)
    if problem is None:
        try:
            metadata = read_metadata_file(path / ".metadata")
            read_json(path / "config.json")
        except (OSError, ValueError, pickle.UnpicklingError) as err:
            return str(err)
        problem = storage_problem(path, metadata, read=not (path / DIGEST_FILE).is_file())
    return problem


def newest_intact(found: list[Path], note: Callable[[str], None]) -> Path | None:
    """The newest of `found` (oldest first) that is intact; `note` hears of each one skipped."""
    for path in reversed(found):
        problem = damage(path)
        if problem is None:
            return path
        note(f"skipping checkpoint {path}: {problem}")
    return None


def resolve_checkpoint(path: str | Path, note: Callable[[str], None] = print) -> Path:
    """An intact step folder, given it or a run folder (then its newest intact one); else a clear error."""
    path = Path(path)
    if (path / MARKER).is_file():
        problem = damage(path)
        if problem:
            raise CheckpointError(f"{path} is damaged: {problem}; pass an intact checkpoint, or the run folder to "
                                  "use its newest intact one")
        return path
    found = complete_checkpoints(path)
    if not found:
        raise CheckpointError(
            f"{path}: neither a complete checkpoint (no {MARKER} marker) nor a run folder with one; "
            "pass OUT/checkpoints/step-XXXXXXXX or a run folder that holds complete checkpoints")
    chosen = newest_intact(found, note)
    if chosen is None:
        raise CheckpointError(f"{path}: none of its {len(found)} checkpoints is intact (see the lines above); "
                              "start again without --resume in a new folder")
    if chosen != found[-1]:
        note(f"using {chosen}, the newest intact checkpoint")
    return chosen


def find_resume_path(out: str | Path, resume: str, note: Callable[[str], None] = print) -> Path | None:
    """`none`: start fresh; `auto`: the newest intact checkpoint of OUT, if any; else that path."""
    if resume in ("", "none"):
        return None
    if resume == "auto":
        return resolve_checkpoint(out, note) if complete_checkpoints(out) else None
    return resolve_checkpoint(resume, note)


def check_architecture(path: Path, model_config: dict[str, Any]) -> None:
    """Refuse a checkpoint whose model differs (gpt-neox `check_checkpoint_args`)."""
    saved = read_json(path / "config.json")["model"]
    diffs = [f"{k}: checkpoint {old!r}, config {new!r}" for k, old, new in architecture_differences(saved, model_config)]
    if diffs:
        raise CheckpointError(
            f"{path} was trained with a different architecture ({'; '.join(diffs)}); use the [model] "
            "section it was saved with (its config.json), or start a new run in another --out folder")


def check_identity(path: Path, identity: dict[str, str]) -> None:
    """Refuse to resume a checkpoint whose tokenizer or data differ from this run's (train.identity)."""
    diffs = identity_differences(read_json(path / "config.json").get("identity"), identity)
    if diffs:
        raise CheckpointError(
            f"{path} was trained with another {' and '.join(d.split(':')[0] for d in diffs)} ({'; '.join(diffs)}); "
            "resume with the [data] it was trained on, or start a new run (--out elsewhere) with "
            f"--set checkpoint.init_from={path} to go on training its weights on this data")


def rng_state() -> dict[str, Any]:
    """Python, NumPy, torch and CUDA RNG states as tensors and plain values (weights_only-safe)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"python": random.getstate(), "torch": torch.get_rng_state(),
             "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached": float(cached)}}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tuples(state["python"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _tuples(value):
    """random.setstate needs tuples where serialisation may hand back lists."""
    return tuple(_tuples(v) for v in value) if isinstance(value, (list, tuple)) else value


@dataclass(frozen=True)
class Snapshot:
    """What one checkpoint holds: the sharded model and optimizer, the run's counters
    (`TrainState.checkpoint_entry`), this rank's loader state and RNG states, and the resolved
    config written beside it."""

    model: Any
    optimizer: Any
    train_state: dict[str, int]
    rank_state: dict[str, Any]
    config_json: dict[str, Any]


def save(out: str | Path, step: int, snapshot: Snapshot, keep_latest_k: int) -> Path:
    """Write step-XXXXXXXX under a temporary name, mark it, rename it; then prune. Collective."""
    model, optimizer, train_state = snapshot.model, snapshot.optimizer, snapshot.train_state
    rank_state, config_json = snapshot.rank_state, snapshot.config_json
    rank = dist.get_rank()
    final = step_dir(out, step)
    tmp = final.with_name(f".tmp-{final.name}")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # debris of a save killed earlier
    dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "train": dict(train_state),
             "scheduler": {"step": train_state["step"]}, f"rank_{rank}": rank_state}
    try:
        dcp.save(state, checkpoint_id=str(tmp))
        dist.barrier()  # every rank's files are in tmp before it is marked
        if rank == 0:
            _finish(tmp, final, config_json)
            prune(out, keep_latest_k)
    except BaseException as err:
        previous = complete_checkpoints(out)
        needed = sum(f.stat().st_size for f in previous[-1].iterdir()) if previous else 0
        full = space_error(err, tmp, after=f"; the previous complete checkpoint under {final.parent} is intact",
                           needed=needed)
        if full is None:
            inner = _wrapped(err)
            if inner is err or isinstance(inner, KeyboardInterrupt):  # Ctrl-C: the command's resume hint
                raise
            raise inner from None  # DCP's BaseException would pass every `except Exception`: no log
        shutil.rmtree(tmp, ignore_errors=True)  # give back what the failed save took
        raise full from None
    dist.barrier()
    return final


def _finish(tmp: Path, final: Path, config_json: dict[str, Any]) -> None:
    """config.json, the digest of every file, then the marker, then the atomic rename: the last steps."""
    (tmp / "config.json").write_text(json.dumps(config_json, indent=2))
    write_digest(tmp)
    (tmp / MARKER).write_text("complete\n")
    shutil.rmtree(final, ignore_errors=True)  # an unmarked folder of the same step, if any
    os.replace(tmp, final)


def prune(out: str | Path, keep_latest_k: int) -> None:
    """Delete debris of killed saves older than the latest checkpoint, and complete checkpoints
    beyond the newest k (0 keeps all)."""
    complete = complete_checkpoints(out)
    for debris in (Path(out) / "checkpoints").glob(".tmp-step-*"):
        if complete and debris.name[len(".tmp-"):] < complete[-1].name:
            shutil.rmtree(debris, ignore_errors=True)
    if keep_latest_k > 0:
        for old in complete_checkpoints(out)[:-keep_latest_k]:
            shutil.rmtree(old, ignore_errors=True)


def _wrapped(err: BaseException) -> BaseException:
    """The first error a CheckpointException wraps ({rank: (exception, traceback)}), else `err` itself."""
    failures = getattr(err, "failures", None)
    if isinstance(err, CheckpointException) and isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        return first[0] if isinstance(first, tuple) else first
    return err


def _dcp_load(state: dict[str, Any], path: Path) -> None:
    """`dcp.load` through the allow-listed metadata reader; a failure is one CheckpointError naming `path`."""
    try:
        dcp.load(state, storage_reader=MetadataReader(str(path)), planner=SafeLoadPlanner())
    except CheckpointException as err:
        inner = _wrapped(err)
        if isinstance(inner, KeyboardInterrupt):  # Ctrl-C while loading: the command's resume hint
            raise
        raise CheckpointError(f"{path}: cannot be read ({type(inner).__name__}: {str(inner).splitlines()[0][:300]}); "
                              "it is damaged: resume from an earlier checkpoint (--resume "
                              f"{path.parent}/step-XXXXXXXX) or start a new run") from None


def load(path: Path, *, model, optimizer) -> tuple[dict[str, int], dict[str, Any] | None]:
    """Restore model and optimizer in place; return (train state, this rank's state or None). Collective."""
    rank = dist.get_rank()
    keys = read_metadata_file(path / ".metadata").state_dict_metadata
    has_rank = any(k.startswith(f"rank_{rank}.") for k in keys)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    train = {"step": 0, "tokens_seen": 0} | {k: 0 for k in ("lines", "nonfinite_skips") if f"train.{k}" in keys}
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd, "train": train}
    if has_rank:
        state[f"rank_{rank}"] = template = _rank_template()
        if f"rank_{rank}.data.position" not in keys:  # saved before positions were recorded
            template["data"].pop("position")
        if f"rank_{rank}.rng.cuda" not in keys:  # saved on a machine without CUDA
            template["rng"].pop("cuda", None)
    _dcp_load(state, path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return state["train"], state.get(f"rank_{rank}")


def _rank_template() -> dict[str, Any]:
    """The shape of a rank entry, so DCP knows which keys to read (values are replaced)."""
    return {"data": {"cursor": 0, "world_size": 0, "position": 0}, "rng": rng_state()}


def load_model_only(path: Path, model) -> None:
    """Load just the model weights of a checkpoint (MSIT starting from a pretrained run). Collective."""
    model_sd = get_model_state_dict(model)
    state = {"model": model_sd}
    _dcp_load(state, path)
    set_model_state_dict(model, state["model"])
