"""Near-duplicate graph: verified edges, connected components, one survivor per component.

Every LSH candidate is checked with the exact Jaccard of the two token sets
and kept as an edge only if J > threshold (dedup_verify.py, sharded over tasks). Components come
from `scipy.sparse.csgraph`; the survivor is chosen by subset priority, then longer text, then
smaller id (deterministic, §1). Only documents in components of two or more are ever looked at
by name: at Pile scale (210M documents) the rest is an int32 label each.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components


def components(n: int, edges: np.ndarray) -> np.ndarray:
    """Component label of each of n nodes (an undirected graph of the verified edges (E, 2))."""
    if not len(edges):
        return np.arange(n)
    graph = coo_matrix((np.ones(len(edges), dtype=np.int8), (edges[:, 0], edges[:, 1])), shape=(n, n)).tocsr()
    return connected_components(graph, directed=False)[1]


def grouped(labels: np.ndarray) -> np.ndarray:
    """Nodes whose component has two or more members, in increasing order."""
    sizes = np.bincount(labels)
    return np.flatnonzero(sizes[labels] > 1)


def survivors(labels: Sequence[int], subsets: Sequence[str], lengths: Sequence[int], ids: Sequence[str],
              priority: Sequence[str]) -> dict[int, int]:
    """{removed position: survivor position} over components of two or more positions."""
    rank = {name: i for i, name in enumerate(priority)}
    members: dict[int, list[int]] = {}
    for k, label in enumerate(labels):
        members.setdefault(label, []).append(k)
    removed = {}
    for group in members.values():
        if len(group) < 2:
            continue
        keep = min(group, key=lambda k: (rank.get(subsets[k], len(rank)), -lengths[k], ids[k]))
        removed.update((k, keep) for k in group if k != keep)
    return removed
