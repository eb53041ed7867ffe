"""What a resumed run must share with the run that wrote its checkpoint, besides the architecture.

A resume that reads other data, or the same data through another tokenizer of the same size,
trains on without an error and produces a model that is neither run's. So each run records the
identity of its tokenizer (the file's SHA-256, or the name of a built-in one such as `bytes`) and
of its data (the SHA-256 of the token shards' manifest, which lists every shard and its counts,
or of the instruction file, or of a saved data set's files), and a resume refuses a checkpoint
whose identity differs, naming the key. A data set read by its id from the offline cache is
identified by that id. Identities are `storage.identity`'s (the bytes' SHA-256, cached by the run
folder under each file's `stat`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from evalm.storage import identity as content_identity

Identity = Callable[[Path], "str | None"]


def run_tokenizer(data: dict[str, Any]) -> Path | None:
    """The tokenizer file a run trains with, if its `[data]` names one that exists (`tokenizer`, or
    `tokenizer.json` beside the token `shards`)."""
    candidates = [data.get("tokenizer"), Path(data["shards"]) / "tokenizer.json" if data.get("shards") else None]
    for candidate in candidates:
        if candidate and str(candidate) != "bytes" and Path(candidate).is_file():
            return Path(candidate)
    return None


def run_identity(data: dict[str, Any], identity: Identity = content_identity) -> dict[str, str]:
    """{"tokenizer": ..., "data": ...} of a run's `[data]` section (pretraining or MSIT); `identity` is the
    run folder's cached one (`RunFolder.identity`)."""
    tokenizer = run_tokenizer(data)
    if data.get("shards"):
        manifest = Path(data["shards"]) / "manifest.json"
        source = identity(manifest) if manifest.is_file() else "path:" + str(data["shards"])
        named = json.loads(manifest.read_text()).get("tokenizer", "") if manifest.is_file() else ""
    else:
        train_file = Path(str(data.get("train_file", "")))
        source = identity(train_file) if train_file.exists() else "id:" + str(data.get("train_file"))
        named = data.get("tokenizer", "bytes")
    return {"tokenizer": identity(tokenizer) if tokenizer else f"name:{named}", "data": source}


def identity_differences(saved: dict[str, str] | None, now: dict[str, str]) -> list[str]:
    """`key: checkpoint X, now Y` for each key that differs; none for a checkpoint that recorded none."""
    if not saved:
        return []
    return [f"{k}: checkpoint {saved.get(k)!r}, now {v!r}" for k, v in now.items() if saved.get(k) != v]
