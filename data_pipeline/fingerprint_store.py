"""The dedup stage's fingerprint store: one `fingerprints/<rank>.npz` per task.

Read by the LSH, token and verify steps (dedup_job.py, dedup_verify.py), which is why it is a
module of its own: both steps depend on it, neither on the other.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from evalm.data_pipeline.config import DedupConfig
from evalm.data_pipeline.runner import StageError


def fingerprint_path(output: Path, rank: int) -> Path:
    """The durable fingerprint file of one task (no Redis copy: docs/data_pipeline.md)."""
    return output / "fingerprints" / f"{rank:05d}.npz"


def load_fingerprints(output: Path, rank: int, config: DedupConfig) -> dict[str, np.ndarray]:
    """One task's fingerprints; refuses a file made with another scheme, seed or num_perm."""
    with np.load(fingerprint_path(output, rank), allow_pickle=False) as data:
        fp = {k: data[k] for k in data.files}
    made = (str(fp["scheme"]), int(fp["seed"]), int(fp["num_perm"]))
    if made != (config.scheme, config.seed, config.num_perm):
        raise StageError(f"{fingerprint_path(output, rank)} was made with (scheme, seed, num_perm)={made}; config wants "
                         f"{(config.scheme, config.seed, config.num_perm)}. Use a new --output folder.")
    return fp


def offsets(output: Path, tasks: int) -> np.ndarray:
    """Dense id of each task's first document (length tasks + 1)."""
    counts = []
    for rank in range(tasks):
        with np.load(fingerprint_path(output, rank), allow_pickle=False) as data:
            counts.append(len(data["lengths"]))
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
