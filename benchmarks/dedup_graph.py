"""The dedup graph at scale: verification, components, survivors on >= 1M documents.

1. Verification, the per-pair cost of the `verify` step (dedup_verify.py): Jaccard of two sorted
   uint64 hash arrays (np.intersect1d) vs the previous single graph task's Python string sets, on
   the same pairs (asserted equal first). Throughput in pairs/s on one core; the step is sharded,
   so its wall time is pairs / (tasks x that rate).
2. The graph step at n documents (default 1M, and n/4 to fit time and memory linearly):
   components of the verified edges (scipy), the grouped documents, survivors by priority; time
   and peak traced memory (tracemalloc sees numpy's and scipy's buffers), against the previous
   step's per-document Python lists of ids, subsets and lengths (built here, measured the same way).
3. Redis: `redis-benchmark` SADD/HSET ops/s and our own loop (dedup_index.BandIndex insert and
   query on the LSH of 8 x 16) in documents/s, on a private redis-server started on a free port.
Then the projection to the Pile (210M documents), linear in documents and pairs.

Synthetic candidates: a fraction `--dup-fraction` of the documents sit in planted near-duplicate
clusters of 2-5 (J ~ 0.97), plus as many false-positive pairs (J ~ 0.8) as LSH at 8 x 16 lets
through; each document in a pair has `--tokens` distinct tokens.
Run: python benchmarks/dedup_graph.py [--docs 1000000] [--tokens 300] [--redis-docs 20000]
Figures on a shared 2-core machine are noisy (other jobs share the cores): read the ratios.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
import tracemalloc

import numpy as np

from evalm.data_pipeline import dedup_graph
from evalm.data_pipeline.dedup_verify import jaccard
from dedup import _redis_server  # benchmarks/dedup.py (this folder is sys.path[0] when run as a script)

PILE_DOCS = 210_000_000
SUBSETS = np.array(["Pile-CC", "Wikipedia (en)", "Books3", "Github", "DM Mathematics"])


def candidates(n: int, dup_fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(true pairs, false-positive pairs) over n documents: clusters of 2-5 chained to their first member."""
    members = rng.permutation(n)[: int(n * dup_fraction)]
    sizes = rng.integers(2, 6, len(members) // 3)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    starts = starts[starts < len(members)]
    true = [(members[a], members[b]) for a, e in zip(starts[:-1], starts[1:]) for b in range(a + 1, e)]
    false = rng.integers(0, n, (len(true) // 4, 2))
    false = false[false[:, 0] != false[:, 1]]
    both = [np.sort(np.asarray(true, dtype=np.int64), axis=1), np.sort(false, axis=1)]
    return both[0], both[1]


def token_arrays(pairs: np.ndarray, tokens: int, jaccard_target: float, rng: np.random.Generator) -> dict:
    """Sorted uint64 hash sets: the pair's second member shares about jaccard_target of the union."""
    sets: dict[int, np.ndarray] = {}
    keep = int(round(tokens * 2 * jaccard_target / (1 + jaccard_target)))
    for i, j in pairs.tolist():
        a = sets.setdefault(i, np.unique(rng.integers(0, 2**63, tokens, dtype=np.int64).astype(np.uint64)))
        if j not in sets:
            shared = rng.choice(a, min(keep, len(a)), replace=False)
            fresh = rng.integers(0, 2**63, tokens - len(shared), dtype=np.int64).astype(np.uint64)
            sets[j] = np.unique(np.concatenate([shared, fresh]))
    return sets


def bench_verify(sets: dict, pairs: np.ndarray, sample: int) -> dict:
    """pairs/s of the hashed verify vs Python string sets (the previous graph step), same pairs."""
    pairs = pairs[:sample]
    strings = {k: {str(int(x)) for x in v} for k, v in sets.items() if k in set(pairs.ravel().tolist())}
    t0 = time.process_time()
    fast = [jaccard(sets[i], sets[j]) for i, j in pairs.tolist()]
    t1 = time.process_time()
    slow = [dedup_graph_jaccard(strings[i], strings[j]) for i, j in pairs.tolist()]
    t2 = time.process_time()
    assert np.allclose(fast, slow)
    return {"pairs": len(pairs), "hashed_pairs_per_s": len(pairs) / (t1 - t0), "string_sets_pairs_per_s": len(pairs) / (t2 - t1),
            "hashed_vs_strings": (t2 - t1) / (t1 - t0)}


def dedup_graph_jaccard(a: set, b: set) -> float:
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)


def traced(fn):
    """(result, seconds, peak traced bytes) of fn()."""
    tracemalloc.start()
    t0 = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return out, seconds, peak


def graph_step(n: int, edges: np.ndarray, rng: np.random.Generator) -> dict:
    """Components + grouped + survivors (the new step) vs per-document lists (the old one's metadata)."""
    subsets = SUBSETS[rng.integers(0, len(SUBSETS), n)]
    lengths = rng.integers(100, 100_000, n)

    def new():
        labels = dedup_graph.components(n, edges)
        nodes = dedup_graph.grouped(labels)
        ids = [f"doc-{k:012d}" for k in nodes.tolist()]
        removed = dedup_graph.survivors(labels[nodes].tolist(), subsets[nodes].tolist(), lengths[nodes].tolist(),
                                        ids, list(SUBSETS))
        return len(nodes), len(removed)

    def old_metadata():
        return ([f"doc-{k:012d}" for k in range(n)], subsets.tolist(), lengths.tolist())

    (grouped, removed), seconds, peak = traced(new)
    _, old_seconds, old_peak = traced(old_metadata)
    return {"documents": n, "edges": len(edges), "grouped": grouped, "removed": removed, "seconds": seconds,
            "peak_mib": peak / 2**20, "old_metadata_lists_seconds": old_seconds, "old_metadata_lists_mib": old_peak / 2**20}


def bench_redis(docs: int) -> dict:
    """redis-benchmark SADD/HSET, then LSH insert and query documents/s through the index (dedup_index.py)."""
    import redis

    from evalm.data_pipeline import dedup_index
    from evalm.data_pipeline.minhash import Fingerprinter

    url, server = _redis_server()  # benchmarks/dedup.py's: a private server on a free port
    port = redis.connection.parse_url(url)["port"]
    try:
        ops = {}
        for pipeline in (1, 16):  # one command per round trip, and 16 (as insertion_session batches)
            out = subprocess.run(["redis-benchmark", "-p", str(port), "-t", "sadd,hset", "-n", "200000", "-P",
                                  str(pipeline), "--csv"], capture_output=True, text=True).stdout
            rows = [line.replace('"', "").split(",") for line in out.splitlines()[1:]]
            ops |= {f"{row[0]}_pipeline{pipeline}": float(row[1]) for row in rows}
        rng = np.random.default_rng(0)
        sigs = Fingerprinter(128, 1).signatures([{f"w{x}" for x in rng.integers(0, 10**6, 300)} for _ in range(docs)])
        index = dedup_index.BandIndex(dedup_index.open_servers(url, 8), b"bench", 8, 16, docs)
        t0 = time.perf_counter()
        index.insert(0, 0, sigs)
        t1 = time.perf_counter()
        sum(1 for _ in index.query(0, sigs))
        t2 = time.perf_counter()
        return {"redis_benchmark_ops_per_s": ops, "lsh_insert_docs_per_s": docs / (t1 - t0),
                "lsh_query_docs_per_s": docs / (t2 - t1), "docs": docs}
    finally:
        server.terminate()
        server.wait(timeout=10)


def projection(small: dict, big: dict, verify: dict, redis_stats: dict | None, tasks: int) -> dict:
    """Pile scale, linear in documents: a line through the two measured sizes."""
    scale = PILE_DOCS / big["documents"]

    def line(key: str) -> float:  # through (small, big), evaluated at the Pile's size
        slope = (big[key] - small[key]) / (big["documents"] - small["documents"])
        return small[key] + slope * (PILE_DOCS - small["documents"])

    pairs = big["edges"] * scale / big["true_fraction"]
    out = {"pile_documents": PILE_DOCS, "pile_candidate_pairs": pairs, "pile_edges": big["edges"] * scale,
           "graph_step_seconds": line("seconds"), "graph_step_gib": line("peak_mib") / 1024,
           "old_metadata_lists_gib": big["old_metadata_lists_mib"] * scale / 1024,
           f"verify_hours_on_{tasks}_tasks": pairs / verify["hashed_pairs_per_s"] / tasks / 3600,
           "verify_hours_one_task_string_sets": pairs / verify["string_sets_pairs_per_s"] / 3600}
    if redis_stats:  # a document is 8 bucket HSETs; a query reads 8 buckets
        out["lsh_insert_hours_one_client"] = PILE_DOCS / redis_stats["lsh_insert_docs_per_s"] / 3600
        out["lsh_query_hours_one_client"] = PILE_DOCS / redis_stats["lsh_query_docs_per_s"] / 3600
        hset = redis_stats["redis_benchmark_ops_per_s"]["HSET_pipeline16"]
        out["lsh_insert_hours_one_redis_saturated"] = PILE_DOCS * 8 / hset / 3600
        out[f"lsh_insert_hours_{tasks}_clients"] = max(out["lsh_insert_hours_one_client"] / tasks,
                                                       out["lsh_insert_hours_one_redis_saturated"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=1_000_000, help="documents of the big graph (default 1M)")
    parser.add_argument("--tokens", type=int, default=300, help="distinct tokens per document in a pair (default 300)")
    parser.add_argument("--dup-fraction", type=float, default=0.1, help="documents in planted clusters (default 0.1)")
    parser.add_argument("--verify-sample", type=int, default=20000, help="pairs timed in part 1 (default 20000)")
    parser.add_argument("--redis-docs", type=int, default=20000, help="documents for the Redis loop; 0 skips it (default 20000)")
    parser.add_argument("--tasks", type=int, default=300, help="verify tasks assumed in the projection (default 300)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    sizes = {}
    for n in (args.docs // 4, args.docs):
        true, false = candidates(n, args.dup_fraction, rng)
        if n == args.docs:  # verification on this graph's own pairs: true and false alike
            mixed = np.concatenate([true[: args.verify_sample // 2], false[: args.verify_sample // 2]])
            sets = token_arrays(true[: args.verify_sample // 2], args.tokens, 0.97, rng)
            sets.update(token_arrays(false[: args.verify_sample // 2], args.tokens, 0.8, rng))
            verify = bench_verify(sets, mixed, args.verify_sample)
        sizes[n] = graph_step(n, true, rng) | {"true_fraction": len(true) / (len(true) + len(false))}
    redis_stats = bench_redis(args.redis_docs) if args.redis_docs and shutil.which("redis-server") else None
    small, big = sizes[args.docs // 4], sizes[args.docs]
    report = {"verify": verify, "graph": list(sizes.values()), "redis": redis_stats,
              "projection": projection(small, big, verify, redis_stats, args.tasks)}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
