"""The LSH index over MinHash signatures: datasketch's `MinHashLSH`, in memory or in Redis.

Why 8 bands x 16 rows (DATA_SPEC.md §4). A pair with Jaccard J agrees on one band of r rows with
probability J^r, so it becomes a candidate with P(J) = 1 - (1 - J^r)^b.
  b=8, r=16:  P(0.95) = 1 - (1 - 0.95^16)^8 = 0.990,  P(0.90) = 0.81,  P(0.80) = 0.20
  datasketch's optimiser for threshold 0.95 (b=3, r=42): P(0.95) = 0.31, most true pairs lost.
So the index is built with explicit `params=(8, 16)`; the false positives it lets through are
removed by the exact Jaccard check in dedup_graph.py.

Keys are the documents' dense integer ids; in Redis as ASCII bytes (`prepickle=False`), so no
pickle is ever written to or read from Redis. The Redis basename is fixed per output folder, so
a relaunched job re-attaches to the buckets its earlier tasks inserted.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import redis
from datasketch import MinHashLSH


class RedisUnavailable(RuntimeError):
    pass


def candidate_probability(jaccard: float, bands: int, rows: int) -> float:
    return 1.0 - (1.0 - jaccard**rows) ** bands


def basename_for(output: str | Path) -> bytes:
    """A fixed Redis key prefix per output folder (bytes, as datasketch requires)."""
    digest = hashlib.sha1(str(Path(output).resolve()).encode()).hexdigest()[:12]
    return f"evalm:{digest}".encode()


def connect(url: str) -> redis.Redis:
    """A client that has answered PING, or a RedisUnavailable saying what to do."""
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=30)
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError, ValueError, OSError) as err:
        raise RedisUnavailable(
            f"cannot reach Redis at {url}: {str(err).rstrip('.')}. Start a server (e.g. `redis-server --port 6379`) "
            "and pass its URL as --redis-url redis://HOST:PORT/DB, or leave --redis-url out to use "
            "the in-memory index (single machine)."
        ) from None
    return client


def make_index(num_perm: int, bands: int, rows: int, redis_url: str | None = None, basename: bytes = b"") -> MinHashLSH:
    """An empty (memory) or attached (Redis) datasketch index with explicit bands."""
    if redis_url is None:
        return MinHashLSH(num_perm=num_perm, params=(bands, rows))
    connect(redis_url)
    params = redis.connection.parse_url(redis_url)
    storage = {"type": "redis", "basename": basename, "redis": params}
    return MinHashLSH(num_perm=num_perm, params=(bands, rows), storage_config=storage, prepickle=False)


def key(dense_id: int, redis_mode: bool) -> int | bytes:
    return str(dense_id).encode() if redis_mode else dense_id


def dense(key_: int | bytes) -> int:
    return int(key_)


def fingerprint_hash(basename: bytes) -> bytes:
    """The Redis hash caching LeanMinHash bytes by document id (DATA_SPEC.md §4, `fp:<run>`)."""
    return b"fp:" + basename
