"""The dedup graph at scale: verification, components, survivors on >= 1M documents.

1. Verification, the per-pair cost of the `verify` step (dedup_verify.py): Jaccard of two sorted
   uint64 hash arrays (np.intersect1d) vs the previous single graph task's Python string sets, on
   the same pairs (asserted equal first). Throughput in pairs/s on one core; the step is sharded,
   so its wall time is pairs / (tasks x that rate).
2. The graph step at n documents (default 1M, and n/4 to fit time and memory linearly):
   components of the verified edges (scipy), the grouped documents, survivors by priority; time
   and peak traced memory (tracemalloc sees numpy's and scipy's buffers), against the previous
   step's per-document Python lists of ids, subsets and lengths (built here, measured the same way).
The Redis index's throughput and bytes per document are benchmarks/dedup_memory.py's.

Synthetic candidates: a fraction `--dup-fraction` of the documents sit in planted near-duplicate
clusters of 2-5 (J ~ 0.97), plus as many false-positive pairs (J ~ 0.8) as LSH at 8 x 16 lets
through; each document in a pair has `--tokens` distinct tokens.
Run: python benchmarks/dedup_graph.py [--docs 1000000] [--tokens 300] [--dup-fraction 0.1]
Figures on a shared 2-core machine are noisy (other jobs share the cores): read the ratios.
"""

from __future__ import annotations

import json
import time
import tracemalloc

import numpy as np

import timing
from evalm.data_pipeline import dedup_graph
from evalm.data_pipeline.dedup_verify import jaccard

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


def main(docs: int = 1_000_000, tokens: int = 300, dup_fraction: float = 0.1, verify_sample: int = 20000) -> None:
    print(timing.machine())
    rng = np.random.default_rng(0)
    sizes = {}
    for n in (docs // 4, docs):
        true, false = candidates(n, dup_fraction, rng)
        if n == docs:  # verification on this graph's own pairs: true and false alike
            mixed = np.concatenate([true[: verify_sample // 2], false[: verify_sample // 2]])
            sets = token_arrays(true[: verify_sample // 2], tokens, 0.97, rng)
            sets.update(token_arrays(false[: verify_sample // 2], tokens, 0.8, rng))
            verify = bench_verify(sets, mixed, verify_sample)
        sizes[n] = graph_step(n, true, rng)
    big = sizes[docs]
    print(json.dumps({"verify": verify, "graph": list(sizes.values())}, indent=2))
    print(f"verify: hashed arrays vs string sets {timing.ratio(verify['hashed_pairs_per_s'], verify['string_sets_pairs_per_s'])}; "
          f"graph step at {docs:,} documents: {big['peak_mib']:.1f} MiB vs the old lists' "
          f"{big['old_metadata_lists_mib']:.1f} MiB ({timing.ratio(big['old_metadata_lists_mib'], big['peak_mib'])} less)")


if __name__ == "__main__":
    raise SystemExit(timing.cli(main, __doc__))
