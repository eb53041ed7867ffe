"""The LSH index in Redis: band buckets on one server, on standalone servers, or on a Redis Cluster.

Addresses (`--redis-url`):
  redis://HOST:PORT/DB                      one server holds every band
  redis://H1:P1/DB,redis://H2:P2/DB,...     standalone servers; band b lives on server b mod n
  redis+cluster://HOST:PORT[,HOST:PORT...]  a Redis Cluster (redis-py's cluster client finds the
                                            nodes); every key of band b carries the hash tag
                                            {b<b>.<t>}, so one slot, hence one node, holds the band
Each band is then served by one node's plain client: a pipeline never spans nodes, and a band's
restart marks (below) live on the node whose restart would lose them.

Encoding, for a document with dense id i and band b (why: at the Pile's 210M documents the index,
not the graph, is what outgrows one machine; datasketch's Redis storage spends about 5 kB per
document, see docs/data_pipeline.md and benchmarks/dedup_memory.py):
  d      = the 64-bit BLAKE2b digest of the band's r row values
  key    = <namespace>:{<tag of b>}#<the top k bits of d>           a Redis hash
  field  = <the other 64 - k bits of d> <i as 4 big-endian bytes>  value: empty
k is chosen from the run's document count so that a hash holds 32 to 64 fields on average:
small hashes stay in Redis' compact listpack encoding (about 15 bytes per field), and the per-key
overhead (about 200 bytes with the key dictionary's share) is shared by as many documents. No per-document key exists (the
index is never asked to remove a document), no value is pickled, HSET of a present field is a
no-op, so re-inserting after a restart is idempotent.
Two band values share a digest by chance with probability about n^2 / 2^65 per band (1e-3 pairs
at n = 210M): a spurious candidate, which the exact Jaccard check then rejects.

Restarts: a restarted Redis without persistence is empty, and a query against it finds nothing,
a wrong but plausible answer. Each insert task therefore writes, for every band, its rank and the
band node's `run_id` (new at each restart) into `<namespace>:{<tag>}!inserted` on that same node,
and only if the run_id did not change while it inserted; a query task checks every band's marks.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import numpy as np
import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.retry import Retry

from evalm.data_pipeline.lsh import RedisUnavailable, guarded
from evalm.storage import redact

CLUSTER_SCHEME = "redis+cluster"
ENTRIES_PER_HASH = 32
"""Least mean fields per hash (the mean lies in [32, 64)): far under Redis' default
hash-max-listpack-entries (512), so hashes keep the compact listpack encoding, while the per-key
overhead (~200 bytes) is shared 32 to 64 ways. Measured (benchmarks/dedup_memory.py, 25k
documents): a mean in [128, 256) saves 6% of the bytes and costs a third of the query rate, since
Redis scans a longer listpack per lookup. A hash past 512 fields (a popular band value) is only
converted to Redis' larger hashtable encoding: correct, just less compact."""
ID_BYTES = 4
MAX_DOCUMENTS = 2 ** (8 * ID_BYTES) - 1
BATCH = 2000
"""Documents per pipeline round trip."""
SCAN_COUNT = 1000
"""HSCAN's COUNT: a listpack hash is always answered in one reply, a hashtable one (past 512
fields) usually is; otherwise the bucket is read whole with HKEYS."""


def band_tag(band: int, bands: int) -> bytes:
    """A hash tag whose slot lies in the middle of the band's share of the slot range.

    redis-cli --cluster create gives each of N nodes a contiguous 1/N of the slots, so tags spread
    this way put about bands/N bands on each node (3/3/2 for 8 bands on 3 nodes) instead of
    wherever CRC16 of `b0`...`b7` happens to fall. Pure function of (band, bands): every run agrees.
    """
    width = REDIS_CLUSTER_HASH_SLOTS / bands
    low, high = (band + 0.375) * width, (band + 0.625) * width
    t = 0
    while not low <= key_slot(f"b{band}.{t}".encode()) < high:
        t += 1
    return f"b{band}.{t}".encode()


def bucket_bits(documents: int) -> int:
    """k such that 2^k hashes per band hold ENTRIES_PER_HASH to twice that documents each."""
    return max(0, math.floor(math.log2(max(documents, 1) / ENTRIES_PER_HASH)))


@dataclass(frozen=True)
class Servers:
    """Who holds each band: `band_clients[b]` is a plain client of the node that serves band b."""

    url: str
    band_clients: list[redis.Redis]
    names: list[str]
    """host:port of each band's node, for messages."""

    def nodes(self) -> list[tuple[str, redis.Redis]]:
        """Each distinct node once, with its name."""
        seen: dict[str, redis.Redis] = {}
        for name, client in zip(self.names, self.band_clients):
            seen.setdefault(name, client)
        return list(seen.items())

    def run_ids(self) -> list[str]:
        """Each band's node's run_id: a new one after every restart of that node."""
        ids = {name: str(client.info("server")["run_id"]) for name, client in self.nodes()}
        return [ids[name] for name in self.names]


def _unreachable(url: str, why: str) -> RedisUnavailable:
    """The refusal, its URL's password masked (storage.secrets): a wrong password is not echoed."""
    return RedisUnavailable(
        f"cannot use Redis at {redact(url)}: {why.rstrip('.')}. Start the server(s) (e.g. `redis-server --port 6379`; "
        "a cluster's every node), pass --redis-url redis://HOST:PORT/DB, a comma-separated list of such URLs, or "
        "redis+cluster://HOST:PORT[,HOST:PORT...], and relaunch the same command; or leave --redis-url out to use "
        "the in-memory index (single machine).")


def _standalone(url: str, bands: int) -> Servers:
    urls = [u.strip() for u in url.split(",") if u.strip()]
    if not urls:
        raise _unreachable(url, "no server address given")
    clients, names = [], []
    for u in urls:
        try:
            client = redis.Redis.from_url(u, socket_connect_timeout=3, socket_timeout=30)
            client.ping()
        except redis.ResponseError as err:  # it answers, but refuses: e.g. a database past its `databases`
            raise RedisUnavailable(f"Redis at {redact(u)} refused the connection: {err}; use a database the server has "
                                   "(0-15 by default: redis://HOST:PORT/0)") from None
        except (redis.RedisError, ValueError, OSError) as err:
            raise _unreachable(u, str(err)) from None
        kw = client.connection_pool.connection_kwargs
        clients.append(client)
        names.append(f"{kw.get('host')}:{kw.get('port')}/{kw.get('db', 0)}")
    return Servers(url, [clients[b % len(clients)] for b in range(bands)], [names[b % len(names)] for b in range(bands)])


def _cluster_nodes(url: str) -> list[ClusterNode]:
    nodes = []
    for part in urlsplit(url).netloc.split(","):
        host, _, port = part.rpartition("@")[2].rpartition(":")  # a user:password@ never reaches a message
        if not host or not port.isdigit():
            raise _unreachable(url, f"'{part}' is not HOST:PORT")
        nodes.append(ClusterNode(host, int(port)))
    return nodes


def _cluster_state(client: redis.Redis) -> str:
    info = client.execute_command("CLUSTER", "INFO")
    if isinstance(info, dict):
        return str(info.get("cluster_state", ""))
    text = info.decode() if isinstance(info, bytes) else str(info)
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("cluster_state:")), "")


def _cluster(url: str, bands: int) -> Servers:
    try:
        cluster = RedisCluster(startup_nodes=_cluster_nodes(url), socket_connect_timeout=3, socket_timeout=30,
                               retry=Retry(NoBackoff(), 1))  # discovery only: fail fast, the relaunch retries
        owners = [cluster.get_node_from_key(b"{" + band_tag(b, bands) + b"}") for b in range(bands)]
    except (redis.RedisError, redis.exceptions.RedisClusterException, OSError) as err:
        raise _unreachable(url, f"no cluster answered ({type(err).__name__}: {err})") from None
    primaries = cluster.get_primaries()
    for node in primaries:  # a dead node named first: the others only say cluster_state:fail
        try:
            cluster.get_redis_connection(node).ping()
        except (redis.RedisError, OSError) as err:
            raise _unreachable(url, f"cluster node {node.name} does not answer ({type(err).__name__}: {err})") from None
    for node in primaries:
        state = _cluster_state(cluster.get_redis_connection(node))
        if state != "ok":
            raise _unreachable(url, f"cluster node {node.name} says cluster_state:{state} (a node is down or slots "
                                    f"are unassigned; `redis-cli -h {node.host} -p {node.port} cluster info` shows why)")
    return Servers(url, [cluster.get_redis_connection(n) for n in owners], [n.name for n in owners])


def open_servers(url: str, bands: int) -> Servers:
    """The nodes of an index address, each answering, or a RedisUnavailable saying what to do."""
    scheme = urlsplit(url.split(",")[0].strip()).scheme
    if scheme == CLUSTER_SCHEME:
        return _cluster(url, bands)
    if scheme not in ("redis", "rediss", "unix"):
        raise _unreachable(url, f"unknown scheme '{scheme}://'")
    return _standalone(url, bands)


class BandIndex:
    """The compact LSH index of one run (encoding in the module docstring)."""

    def __init__(self, servers: Servers, namespace: bytes, bands: int, rows: int, documents: int):
        if documents > MAX_DOCUMENTS:
            raise RedisUnavailable(f"{documents} documents exceed the index's {ID_BYTES}-byte ids; split the corpus")
        self.servers, self.namespace, self.bands, self.rows = servers, namespace, bands, rows
        self.k = bucket_bits(documents)
        self.tags = [band_tag(b, bands) for b in range(bands)]

    def bucket(self, band: int, digest: int) -> tuple[bytes, bytes]:
        """(key, field prefix) of a band digest."""
        prefix, rest = digest >> (64 - self.k), digest & ((1 << (64 - self.k)) - 1)
        key = self.namespace + b":{" + self.tags[band] + b"}#" + prefix.to_bytes((self.k + 7) // 8, "big")
        return key, rest.to_bytes((64 - self.k + 7) // 8, "big")

    def mark_key(self, band: int) -> bytes:
        return self.namespace + b":{" + self.tags[band] + b"}!inserted"

    def digests(self, signatures: np.ndarray) -> list[list[int]]:
        """Per document, the 64-bit digest of each band's rows."""
        rows = np.ascontiguousarray(signatures[:, : self.bands * self.rows], dtype="<u4")  # affine32: < 2^32
        out = []
        for sig in rows:
            raw = sig.tobytes()
            step = 4 * self.rows
            out.append([int.from_bytes(hashlib.blake2b(raw[b * step:(b + 1) * step], digest_size=8).digest(), "big")
                        for b in range(self.bands)])
        return out

    def insert(self, rank: int, first: int, signatures: np.ndarray) -> None:
        """Add documents first, first+1, ... and mark the task inserted on every band it fully reached."""
        with guarded(self.servers.url, f"lsh_insert task {rank}"):
            before = self.servers.run_ids()
            for start in range(0, len(signatures), BATCH):
                digests = self.digests(signatures[start:start + BATCH])
                for b, client in enumerate(self.servers.band_clients):
                    pipe = client.pipeline(transaction=False)
                    for i, doc in enumerate(digests):
                        key, rest = self.bucket(b, doc[b])
                        pipe.hset(key, rest + (first + start + i).to_bytes(ID_BYTES, "big"), b"")
                    pipe.execute()
            after = self.servers.run_ids()
            for b, client in enumerate(self.servers.band_clients):
                if before[b] == after[b]:  # else the node restarted and lost part of it: left unmarked
                    client.hset(self.mark_key(b), str(rank), after[b])

    def query(self, first: int, signatures: np.ndarray) -> Iterator[tuple[int, int]]:
        """(other, me) for every indexed document `other` sharing a band digest with document `me`.

        Redis filters each hash by the digest's field prefix (HSCAN MATCH), so only the few
        matching fields travel; a hash too large for one HSCAN reply is read whole (HKEYS)."""
        for start in range(0, len(signatures), BATCH):
            digests = self.digests(signatures[start:start + BATCH])
            found: list[set[int]] = [set() for _ in digests]
            for b, client in enumerate(self.servers.band_clients):
                pipe = client.pipeline(transaction=False)
                buckets = [self.bucket(b, doc[b]) for doc in digests]
                for key, rest in buckets:
                    pipe.hscan(key, 0, match=_glob_escape(rest) + b"*", count=SCAN_COUNT)  # NOVALUES needs Redis 7.4
                for i, ((key, rest), (cursor, fields)) in enumerate(zip(buckets, pipe.execute())):
                    if cursor != 0:  # a popular bucket in Redis' hashtable encoding: rare
                        fields = client.hkeys(key)
                    found[i].update(int.from_bytes(f[-ID_BYTES:], "big") for f in fields if f[:-ID_BYTES] == rest)
            for i, others in enumerate(found):
                yield from ((other, first + start + i) for other in sorted(others))

    def missing_inserts(self, tasks: int) -> list[int]:
        """Insert tasks some band's node does not hold (never inserted, or lost in a restart)."""
        now = self.servers.run_ids()
        missing = set()
        for b, client in enumerate(self.servers.band_clients):
            marks = client.hgetall(self.mark_key(b))
            missing.update(r for r in range(tasks) if marks.get(str(r).encode()) != now[b].encode())
        return sorted(missing)


def _glob_escape(raw: bytes) -> bytes:
    """raw as a Redis glob that matches only itself (the digest bytes may hold * ? [ ] \\)."""
    return b"".join(b"\\" + bytes([c]) if c in b"*?[]\\" else bytes([c]) for c in raw)


def run_keys(client: redis.Redis, namespace: bytes) -> Iterator[bytes]:
    """Every key of a run on one node (a SCAN: never blocks the server)."""
    yield from client.scan_iter(match=namespace + b"*", count=1000)


def measure(url: str, namespace: bytes, bands: int) -> dict[str, dict[str, int]]:
    """Per node: the run's keys and the bytes Redis reports for them (MEMORY USAGE, all samples)."""
    servers = open_servers(url, bands)
    out = {}
    with guarded(url, "measuring the index"):
        for name, client in servers.nodes():
            keys, used = 0, 0
            pipe = client.pipeline(transaction=False)
            for key in run_keys(client, namespace):
                pipe.memory_usage(key, samples=0)
                keys += 1
                if len(pipe) == 1000:
                    used += sum(x or 0 for x in pipe.execute())
            used += sum(x or 0 for x in pipe.execute())
            out[name] = {"keys": keys, "bytes": used}
    return out


def drop(url: str, namespace: bytes, bands: int) -> int:
    """Delete every key of a run on every node; returns how many there were."""
    servers = open_servers(url, bands)
    removed = 0
    with guarded(url, "removing the index"):
        for _, client in servers.nodes():
            batch = []
            for key in run_keys(client, namespace):
                batch.append(key)
                if len(batch) == 1000:
                    removed += _unlink(client, batch)
                    batch = []
            removed += _unlink(client, batch)
    return removed


def _unlink(client: redis.Redis, keys: list[bytes]) -> int:
    """One UNLINK per key in a pipeline: a cluster node refuses one command over several slots."""
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.unlink(key)
    return sum(pipe.execute())

