"""Intervals that respect the ICL design: a hierarchical bootstrap over seeds and test items.

Every seed draws its own demonstrations, and all of a seed's test items share that one draw, so
items are not independent observations: the spread between seeds can dwarf a binomial interval
over items x seeds (docs/evaluation.md). One replicate therefore resamples the seeds with replacement,
then the test items:

- crossed design (every seed scores the same items, a real task's test split): one item draw per
  replicate, shared by the chosen seeds, since an item's difficulty is shared across seeds;
- nested design (each seed has its own items, e.g. a fresh synthetic episode per seed): a separate
  item draw inside every chosen seed.

A replicate's value is the mean over its seeds of the mean over its items; the interval is the
percentile interval of the replicates. A paired comparison (method A vs B, k vs 0 shots, a method
vs a baseline) bootstraps the per-item differences on the same items and seeds, which is what
makes it paired. With one seed, only items are resampled (the seed spread is then unknown, and
the results say so through `n_seeds`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

REPLICATES = 2000
LEVEL = 0.95
BLOCK_VALUES = 1 << 22
"""Values gathered at once when replicates are computed together (32 MiB of floats): a large test split
is resampled in blocks of replicates, never all 2,000 copies of it at once."""


def resampled_means(rows: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """(R, K): the mean of each of the K rows of `rows` (K, N) over each index vector of `draws` (R, N).

    The same numbers as a loop of `rows[:, d].mean(axis=1)` over the draws (each mean still reduces one
    row's N values in order), computed a block of replicates at a time instead of one by one.
    """
    step = max(1, BLOCK_VALUES // max(rows.size, 1))
    return np.concatenate([rows[:, draws[i:i + step]].mean(axis=2).T for i in range(0, len(draws), step)])


def hierarchical_interval(values: Sequence[np.ndarray], item_ids: Sequence[Sequence[int]], *,
                          replicates: int = REPLICATES, level: float = LEVEL, seed: int = 0) -> tuple[float, float]:
    """Percentile interval of the mean of per-seed item means; values[s] is seed s's per-item vector."""
    cells = [np.asarray(v, dtype=float) for v in values]
    if not cells or any(len(c) == 0 for c in cells):
        raise ValueError("every seed needs at least one scored item")
    rng = np.random.default_rng(seed)
    n_seeds = len(cells)
    chosen = rng.integers(0, n_seeds, size=(replicates, n_seeds))
    crossed = all(list(ids) == list(item_ids[0]) for ids in item_ids)
    if crossed:
        matrix = np.stack(cells)  # (S, N)
        draws = rng.integers(0, matrix.shape[1], size=(replicates, matrix.shape[1]))
        per_seed = resampled_means(matrix, draws)  # (R, S): each seed's mean on the draw
        stats = np.take_along_axis(per_seed, chosen, axis=1).mean(axis=1)
    else:
        slot_means = np.empty((replicates, n_seeds))
        for s, cell in enumerate(cells):  # the replicates/slots that chose seed s get fresh item draws
            rows, slots = np.nonzero(chosen == s)
            slot_means[rows, slots] = cell[rng.integers(0, len(cell), size=(len(rows), len(cell)))].mean(axis=1)
        stats = slot_means.mean(axis=1)
    tail = (1.0 - level) / 2
    lo, hi = np.quantile(stats, [tail, 1.0 - tail])
    return float(lo), float(hi)


def interval_summary(values: Sequence[np.ndarray], item_ids: Sequence[Sequence[int]], **kwargs) -> dict:
    """Mean over seeds, per-seed spread and the hierarchical interval of one cell."""
    per_seed = [float(np.mean(v)) for v in values]
    lo, hi = hierarchical_interval(values, item_ids, **kwargs)
    return {"mean": float(np.mean(per_seed)), "per_seed": per_seed,
            "seed_std": float(np.std(per_seed, ddof=1)) if len(per_seed) > 1 else 0.0,
            "ci95": [lo, hi]}
