"""The LSH index over MinHash signatures: datasketch's `MinHashLSH` in memory; in Redis, dedup_index.py.

Why 8 bands x 16 rows. A pair with Jaccard J agrees on one band of r rows with probability J^r,
so it becomes a candidate with P(J) = 1 - (1 - J^r)^b.
  b=8, r=16:  P(0.95) = 1 - (1 - 0.95^16)^8 = 0.990,  P(0.90) = 0.81,  P(0.80) = 0.20
  datasketch's optimiser for threshold 0.95 (b=3, r=42): P(0.95) = 0.31, most true pairs lost.
So the index is built with explicit `params=(8, 16)`; the false positives it lets through are
removed by the exact Jaccard check in dedup_verify.py.

Every Redis key of a run starts with its namespace, `evalm:<hash of the output folder>`: a relaunch
re-attaches to the buckets its earlier tasks inserted, a fresh or `--overwrite` launch first
deletes whatever a dead run left under it, and the completed run deletes it (unless
`--keep-index`), so neither a rerun nor a second corpus in the same database mixes with an old
index. The Redis encoding, the cluster layout and the restart marks are dedup_index.py's.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from datasketch import MinHashLSH

from evalm.config_toolkit import UserError
from evalm.storage import redact


class RedisUnavailable(UserError, RuntimeError):
    """Redis cannot be used as asked; the message names the address and what to do."""


def candidate_probability(jaccard: float, bands: int, rows: int) -> float:
    return 1.0 - (1.0 - jaccard**rows) ** bands


def basename_for(output: str | Path) -> bytes:
    """A fixed Redis key prefix per output folder: a relaunch finds its earlier tasks' keys."""
    digest = hashlib.sha1(str(Path(output).resolve()).encode()).hexdigest()[:12]
    return f"evalm:{digest}".encode()


LOST = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterError, redis.exceptions.AskError,
        redis.exceptions.TryAgainError, redis.exceptions.RedisClusterException)
"""A node gone, restarting (LOADING), a cluster down or its slots moving: all fixed by a relaunch."""

ADVICE = "Start it again and relaunch the same command: the tasks whose index was lost are redone"


@contextmanager
def guarded(url: str, what: str) -> Iterator[None]:
    """Turn a connection lost mid-task into one line naming the server and what to do."""
    try:
        yield
    except LOST as err:
        raise RedisUnavailable(f"Redis at {redact(url)} went away during {what} ({str(err).rstrip('.')}). {ADVICE}.") from None


def make_index(num_perm: int, bands: int, rows: int) -> MinHashLSH:
    """An empty in-memory datasketch index with explicit bands."""
    return MinHashLSH(num_perm=num_perm, params=(bands, rows))
