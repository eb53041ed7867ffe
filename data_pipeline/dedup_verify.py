"""Candidate verification sharded over tasks (exact Jaccard > threshold per candidate).

  tokens  N tasks  task r reads only its own documents, once, and keeps those that appear in a
                   candidate pair: the sorted 64-bit hashes of each one's token set
                   -> tokens/<rank>.hashes.npy (uint64, back to back) + tokens/<rank>.index.npy
                   (dense id, start, length)
  verify  N tasks  the candidate rows, concatenated in file order (each unordered pair once), are
                   cut into N equal slices; task r computes the Jaccard of its slice's pairs from
                   the memory-mapped hash files -> edges/<rank>.npy, the pairs above the threshold

So the corpus is read once in all (not once by a single graph task), each task holds only its share
of pairs, and the graph step reads edges and fingerprint metadata, never documents.

Hashing tokens is exact unless two distinct tokens of a pair's union share a 64-bit BLAKE2b
hash: probability <= n^2 / 2^65 for a union of n tokens (3e-10 at n = 10^5, the longest
documents), against a MinHash estimate whose standard error is 0.02 at J = 0.95.
"""

from __future__ import annotations

from hashlib import blake2b
from pathlib import Path

import numpy as np
from datatrove.pipeline.base import PipelineStep

from evalm.storage import replaced
from evalm.data_pipeline.config import DedupConfig
from evalm.data_pipeline.fingerprint_store import offsets
from evalm.data_pipeline.minhash import token_set
from evalm.data_pipeline.runner import reader


def token_hashes(text: str) -> np.ndarray:
    """The document's token set as sorted unique uint64 hashes."""
    digests = b"".join(blake2b(t.encode(), digest_size=8).digest() for t in token_set(text))
    return np.unique(np.frombuffer(digests, dtype="<u8"))


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard of two sorted unique arrays; 1.0 for two empty sets (as the string version)."""
    if not len(a) and not len(b):
        return 1.0
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (len(a) + len(b) - inter)


def candidate_files(output: Path) -> list[Path]:
    return sorted((output / "candidates").glob("*.npy"))


def candidate_rows(output: Path) -> list[np.ndarray]:
    """Every candidates file, memory-mapped ((P_f, 2) int64 each)."""
    return [np.load(f, mmap_mode="r", allow_pickle=False) for f in candidate_files(output)]


def _save(path: Path, array: np.ndarray) -> None:
    with replaced(path) as tmp, open(tmp, "wb") as f:  # a handle: np.save appends nothing, same bytes each run
        np.save(f, array, allow_pickle=False)


class TokenStep(PipelineStep):
    name = "tokens"

    def __init__(self, output: str, config: DedupConfig, tasks: int):
        super().__init__()
        self.output, self.config, self.tasks = output, config, tasks

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        output = Path(self.output)
        first, end = (int(x) for x in offsets(output, self.tasks)[rank: rank + 2])
        needed = np.zeros(end - first, dtype=bool)
        for rows in candidate_rows(output):
            for lo in range(0, len(rows), 1 << 20):  # chunks: the whole list never sits in memory
                ends = np.asarray(rows[lo: lo + (1 << 20)]).ravel()
                needed[ends[(ends >= first) & (ends < end)] - first] = True
        hashes, index, start = [], [], 0
        for i, doc in enumerate(reader(output).run(None, rank, world_size)):
            if needed[i]:
                h = token_hashes(doc.text)
                hashes.append(h)
                index.append((first + i, start, len(h)))
                start += len(h)
        _save(output / "tokens" / f"{rank:05d}.hashes.npy",
              np.concatenate(hashes) if hashes else np.empty(0, dtype=np.uint64))
        _save(output / "tokens" / f"{rank:05d}.index.npy", np.asarray(index, dtype=np.int64).reshape(-1, 3))


class VerifyStep(TokenStep):
    name = "verify"

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        output, threshold = Path(self.output), self.config.threshold
        pairs = self.my_pairs(output, rank)
        sets = self.token_sets(output)
        keep = [jaccard(sets[i], sets[j]) > threshold for i, j in pairs.tolist()]
        _save(output / "edges" / f"{rank:05d}.npy", pairs[np.asarray(keep, dtype=bool)].reshape(-1, 2))

    def my_pairs(self, output: Path, rank: int) -> np.ndarray:
        """Rows [r P / N, (r + 1) P / N) of the concatenated candidate files."""
        files = candidate_rows(output)
        sizes = np.cumsum([0, *(len(f) for f in files)])
        lo, hi = sizes[-1] * rank // self.tasks, sizes[-1] * (rank + 1) // self.tasks
        parts = [np.asarray(f[max(lo - s, 0): max(min(hi - s, len(f)), 0)]) for f, s in zip(files, sizes[:-1])]
        return np.concatenate([np.empty((0, 2), dtype=np.int64), *parts]).astype(np.int64)

    def token_sets(self, output: Path) -> "_Sets":
        return _Sets(output, self.tasks)


class _Sets:
    """dense id -> its hash set, from the memory-mapped tokens files of every task. The index is
    sorted by dense id (tasks hold increasing ranges), so a lookup is a binary search: 32 bytes
    per needed document rather than a dict entry."""

    def __init__(self, output: Path, tasks: int):
        self.hashes = [np.load(output / "tokens" / f"{t:05d}.hashes.npy", mmap_mode="r") for t in range(tasks)]
        parts = [np.load(output / "tokens" / f"{t:05d}.index.npy") for t in range(tasks)]
        self.task = np.concatenate([np.full(len(p), t, dtype=np.int64) for t, p in enumerate(parts)])
        self.index = np.concatenate(parts) if parts else np.empty((0, 3), dtype=np.int64)

    def __getitem__(self, dense: int) -> np.ndarray:
        k = int(np.searchsorted(self.index[:, 0], dense))
        _, start, length = self.index[k].tolist()
        return np.asarray(self.hashes[int(self.task[k])][start: start + length])
