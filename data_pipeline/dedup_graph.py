"""Near-duplicate graph: verified edges, connected components, one survivor per component.

DATA_SPEC.md §4: every LSH candidate is checked with the exact Jaccard of the two token sets
and kept as an edge only if J > threshold (the MinHash estimate's standard error, about 0.02
at 0.95, is too coarse for a hard cut). Components come from `scipy.sparse.csgraph`; the survivor
is chosen by subset priority, then longer text, then smaller id (deterministic, §1).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components


def jaccard(a: set[str], b: set[str]) -> float:
    if not a and not b:
        return 1.0
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)


def verify(
    pairs: Iterable[tuple[int, int]], tokens: Callable[[int], set[str]], threshold: float
) -> list[tuple[int, int, float]]:
    """Candidate pairs whose exact Jaccard is strictly above the threshold."""
    edges = []
    for i, j in pairs:
        similarity = jaccard(tokens(i), tokens(j))
        if similarity > threshold:
            edges.append((i, j, similarity))
    return edges


def components(n: int, edges: Sequence[tuple[int, int, float]]) -> np.ndarray:
    """Component label of each of n nodes (an undirected graph of the verified edges)."""
    if not edges:
        return np.arange(n)
    src = np.fromiter((e[0] for e in edges), dtype=np.int64, count=len(edges))
    dst = np.fromiter((e[1] for e in edges), dtype=np.int64, count=len(edges))
    graph = coo_matrix((np.ones(len(edges), dtype=np.int8), (src, dst)), shape=(n, n)).tocsr()
    return connected_components(graph, directed=False)[1]


def survivors(
    labels: np.ndarray, subsets: Sequence[str], lengths: Sequence[int], ids: Sequence[str], priority: Sequence[str]
) -> dict[int, int]:
    """{removed node: survivor node} over components of two or more nodes."""
    rank = {name: i for i, name in enumerate(priority)}
    members: dict[int, list[int]] = {}
    for node, label in enumerate(labels.tolist()):
        members.setdefault(label, []).append(node)
    removed = {}
    for nodes in members.values():
        if len(nodes) < 2:
            continue
        keep = min(nodes, key=lambda k: (rank.get(subsets[k], len(rank)), -lengths[k], ids[k]))
        removed.update((k, keep) for k in nodes if k != keep)
    return removed
