"""The LSH index over MinHash signatures: datasketch's `MinHashLSH`, in memory or in Redis.

Why 8 bands x 16 rows (DATA_SPEC.md §4). A pair with Jaccard J agrees on one band of r rows with
probability J^r, so it becomes a candidate with P(J) = 1 - (1 - J^r)^b.
  b=8, r=16:  P(0.95) = 1 - (1 - 0.95^16)^8 = 0.990,  P(0.90) = 0.81,  P(0.80) = 0.20
  datasketch's optimiser for threshold 0.95 (b=3, r=42): P(0.95) = 0.31, most true pairs lost.
So the index is built with explicit `params=(8, 16)`; the false positives it lets through are
removed by the exact Jaccard check in dedup_graph.py.

Keys are the documents' dense integer ids; in Redis as ASCII bytes (`prepickle=False`), so no
pickle is ever written to or read from Redis. Every Redis key of a run starts with its namespace,
`evalm:<hash of the output folder>` (datasketch's `basename`): a relaunch re-attaches to the buckets
its earlier tasks inserted, a fresh or `--overwrite` launch first deletes whatever a dead run left
under it, and the completed run deletes it (unless `--keep-index`), so neither a rerun nor a
second corpus in the same database mixes with an old index.

A restart of a Redis without persistence silently empties the index, and a query against an empty
index finds no pairs: a wrong but plausible result. So each insert task records itself in
`<namespace>_inserted` with the server's `run_id` (which changes at every restart); a query task
checks that every insert task is recorded under the current run_id before and after it queries.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
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


ADVICE = "Start it again and relaunch the same command: the tasks whose index was lost are redone"


def connect(url: str) -> redis.Redis:
    """A client that has answered PING, or a RedisUnavailable saying what to do."""
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=3, socket_timeout=30)
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError, ValueError, OSError) as err:
        raise RedisUnavailable(
            f"cannot reach Redis at {url}: {str(err).rstrip('.')}. Start a server (e.g. `redis-server --port 6379`), "
            "pass its URL as --redis-url redis://HOST:PORT/DB and relaunch the same command, or leave "
            "--redis-url out to use the in-memory index (single machine)."
        ) from None
    except redis.ResponseError as err:  # e.g. a database number past the server's `databases`
        raise RedisUnavailable(f"Redis at {url} refused the connection: {err}; use a database the server has "
                               "(0-15 by default: redis://HOST:PORT/0)") from None
    return client


@contextmanager
def guarded(url: str, what: str) -> Iterator[None]:
    """Turn a connection lost mid-task into one line naming the server and what to do."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError) as err:
        raise RedisUnavailable(f"Redis at {url} went away during {what} ({str(err).rstrip('.')}). {ADVICE}.") from None


def server_run(client: redis.Redis) -> str:
    """The server's run_id: a new one after every restart."""
    return str(client.info("server")["run_id"])


def mark_inserted(client: redis.Redis, basename: bytes, rank: int, run_id: str) -> None:
    client.hset(basename + b"_inserted", str(rank), run_id)


def missing_inserts(client: redis.Redis, basename: bytes, tasks: int) -> list[int]:
    """Insert tasks whose buckets this server does not hold (never inserted, or lost in a restart)."""
    now = server_run(client).encode()
    marks = client.hgetall(basename + b"_inserted")
    return [r for r in range(tasks) if marks.get(str(r).encode()) != now]


def drop_index(url: str, basename: bytes) -> int:
    """Delete every key of a namespace; returns how many there were."""
    client = connect(url)
    removed = 0
    with guarded(url, "removing the index"):
        batch = []
        for name in client.scan_iter(match=basename + b"*", count=1000):
            batch.append(name)
            if len(batch) == 1000:
                removed += client.unlink(*batch)
                batch = []
        if batch:
            removed += client.unlink(*batch)
    return removed


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
