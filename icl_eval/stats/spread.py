"""How much of the spread between runs is the draw and how much the order (Bertsch et al. 2025).

With draw seeds s = 1..S (which demonstrations) and order seeds o = 1..O (how the same
demonstrations are arranged), A[s, o] is the accuracy of one (draw, order) run. The split is

    order_std = sqrt(mean_s var_o A[s, :])      (spread over orders of the same demonstrations)
    draw_std  = std_s (mean_o A[s, :])          (spread over draws, orders averaged out)

with sample variances (ddof = 1). Each comes with a 95% percentile interval from resampling the
test items (one item draw shared by every run that scores the same items, a separate one per seed
where each seed has its own items): the interval says how well the items pin the split down.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

REPLICATES = 1000


def _split(acc: np.ndarray) -> tuple[float, float]:
    """(draw_std, order_std) of an (S, O) accuracy matrix."""
    order = float(np.sqrt(acc.var(axis=1, ddof=1).mean())) if acc.shape[1] > 1 else 0.0
    draw = float(acc.mean(axis=1).std(ddof=1)) if acc.shape[0] > 1 else 0.0
    return draw, order


def order_split(correct: Sequence[np.ndarray], item_ids: Sequence[Sequence], *, replicates: int = REPLICATES,
                seed: int = 0) -> dict:
    """`correct[s]`: an (O, N_s) matrix of per-item correctness of draw s in each order; `item_ids[s]` its items."""
    cells = [np.asarray(c, dtype=float) for c in correct]
    acc = np.stack([c.mean(axis=1) for c in cells])  # (S, O)
    draw, order = _split(acc)
    rng = np.random.default_rng(seed)
    crossed = all(list(ids) == list(item_ids[0]) for ids in item_ids)
    reps = np.empty((replicates, 2))
    for r in range(replicates):
        shared = rng.integers(0, cells[0].shape[1], cells[0].shape[1]) if crossed else None
        boot = np.stack([c[:, shared if crossed else rng.integers(0, c.shape[1], c.shape[1])].mean(axis=1)
                         for c in cells])
        reps[r] = _split(boot)
    lo, hi = np.quantile(reps, [0.025, 0.975], axis=0)
    return {"draw_std": draw, "draw_std_ci95": [float(lo[0]), float(hi[0])],
            "order_std": order, "order_std_ci95": [float(lo[1]), float(hi[1])],
            "n_draws": int(acc.shape[0]), "n_orders": int(acc.shape[1]), "accuracy": acc.tolist()}
