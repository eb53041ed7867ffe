"""Bytes per document of the Redis LSH index: datasketch's encoding (before) vs the compact one.

Both index the same MinHash signatures (128 permutations, 8 bands x 16 rows) of synthetic
documents (Zipf(1.1) words, benchmarks/dedup.py) on a private redis-server (loopback, no
persistence), one encoding at a time on an emptied server:
  before  datasketch MinHashLSH(storage_config={"type": "redis"}, prepickle=False), as this
          project's index was built until the compact encoding: per band a hash of band values,
          a set per band value, and per document a key entry and a list of its 8 band values
  after   data_pipeline/dedup_index.py: per band 2^k hashes of (digest rest + 4-byte id) fields
Figures per document: `INFO memory` used_memory after minus before (what the server really
spends, its key dictionary included), and the sum of `MEMORY USAGE key SAMPLES 0` over the keys;
with them, one client's documents/s inserted (all) and queried (the first 5,000), same run.
The index's split over a Redis Cluster's nodes (a band is one slot) is in every dedup run's manifest
(`redis.nodes`: each node's keys and bytes), printed by benchmarks/dedup_datatrove.py's cluster contender.

The compact index keeps its fill (fields per hash) within [32, 64) at any size, so bytes per
document measured at 10^5 documents hold at 2 x 10^8 (its fields there are one byte shorter: fewer
digest bits left after the hash's k bits).
Run: python benchmarks/dedup_memory.py [--docs 25000,100000]
"""

from __future__ import annotations

import json
import time

import numpy as np
import redis
from datasketch import MinHashLSH

import timing
from dedup import redis_server, zipf_docs  # benchmarks/dedup.py (this folder is sys.path[0] as a script)
from evalm.data_pipeline import dedup_index
from evalm.data_pipeline.minhash import Fingerprinter, lean, token_set

BANDS, ROWS = 8, 16
QUERIED = 5000


def signatures(n: int) -> np.ndarray:
    """MinHash signatures of n synthetic documents, computed in slices to bound memory."""
    fp, out = Fingerprinter(128, 1), []
    for start in range(0, n, 5000):
        docs = zipf_docs(min(5000, n - start), seed=start)
        out.append(fp.signatures([token_set(d) for d in docs]))
    return np.concatenate(out)


def used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def build_before(url: str, sigs: np.ndarray):
    """Insert with datasketch's Redis storage; returns a function querying one signature."""
    params = redis.connection.parse_url(url)
    index = MinHashLSH(num_perm=128, params=(BANDS, ROWS), prepickle=False,
                       storage_config={"type": "redis", "basename": b"evalm:before", "redis": params})
    with index.insertion_session() as session:
        for i, sig in enumerate(sigs):
            session.insert(str(i).encode(), lean(sig, 1), check_duplication=False)

    def query(part: np.ndarray) -> int:
        return sum(len(index.query(lean(sig, 1))) for sig in part)
    return query


def build_after(url: str, sigs: np.ndarray):
    """Insert with the compact encoding; returns a function querying signatures."""
    index = dedup_index.BandIndex(dedup_index.open_servers(url, BANDS), b"evalm:after", BANDS, ROWS, len(sigs))
    index.insert(0, 0, sigs)

    def query(part: np.ndarray) -> int:
        return sum(1 for _ in index.query(0, part))
    return query


def measure_one(url: str, sigs: np.ndarray, build, namespace: bytes) -> dict:
    """Memory per document, and documents/s inserted (all) and queried (the first QUERIED)."""
    client = redis.Redis.from_url(url)
    client.flushall()
    start = used(client)
    t0 = time.perf_counter()
    query = build(url, sigs)
    t1 = time.perf_counter()
    query(sigs[:QUERIED])
    t2 = time.perf_counter()
    grown = used(client) - start
    nodes = dedup_index.measure(url, namespace, BANDS).values()  # MEMORY USAGE of every key of the run
    keys, usage = sum(n["keys"] for n in nodes), sum(n["bytes"] for n in nodes)
    client.flushall()
    n = len(sigs)
    return {"documents": n, "keys": keys, "keys_per_document": keys / n, "used_memory_bytes": grown,
            "used_memory_bytes_per_document": grown / n, "memory_usage_bytes_per_document": usage / n,
            "insert_docs_per_s": n / (t1 - t0), "query_docs_per_s": min(QUERIED, n) / (t2 - t1)}


def main(docs: str = "25000,100000") -> None:
    print(timing.machine())
    report: dict = {"standalone": []}
    with redis_server() as url:
        for n in (int(x) for x in docs.split(",")):
            sigs = signatures(n)
            before, after = measure_one(url, sigs, build_before, b"evalm:before"), measure_one(url, sigs, build_after, b"evalm:after")
            ratio = before["used_memory_bytes_per_document"] / after["used_memory_bytes_per_document"]
            speed = {k: after[k] / before[k] for k in ("insert_docs_per_s", "query_docs_per_s")}
            report["standalone"].append({"before": before, "after": after, "before_over_after": ratio,
                                         "after_speed_over_before": speed})
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    raise SystemExit(timing.cli(main, __doc__))
