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

from evalm.icl_eval.stats.bootstrap import resampled_means

REPLICATES = 1000


def _split(acc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(draw_std, order_std) of an (S, O) accuracy matrix, or of each matrix of a stack (..., S, O)."""
    n_draws, n_orders = acc.shape[-2:]
    order = np.sqrt(acc.var(axis=-1, ddof=1).mean(axis=-1)) if n_orders > 1 else np.zeros(acc.shape[:-2])
    draw = acc.mean(axis=-1).std(axis=-1, ddof=1) if n_draws > 1 else np.zeros(acc.shape[:-2])
    return draw, order


def order_split(correct: Sequence[np.ndarray], item_ids: Sequence[Sequence], *, replicates: int = REPLICATES,
                seed: int = 0) -> dict:
    """`correct[s]`: an (O, N_s) matrix of per-item correctness of draw s in each order; `item_ids[s]` its items."""
    cells = [np.asarray(c, dtype=float) for c in correct]
    acc = np.stack([c.mean(axis=1) for c in cells])  # (S, O)
    draw, order = (float(x) for x in _split(acc))
    rng = np.random.default_rng(seed)
    crossed = all(list(ids) == list(item_ids[0]) for ids in item_ids)
    if crossed:  # replicate r's one item draw, shared by every draw seed
        shared = rng.integers(0, cells[0].shape[1], (replicates, cells[0].shape[1]))
        draws = [shared] * len(cells)
    else:  # a draw per replicate inside each seed, taken from the generator replicate by replicate, seed by seed
        picks = [[rng.integers(0, c.shape[1], c.shape[1]) for c in cells] for _ in range(replicates)]
        draws = [np.stack([p[s] for p in picks]) for s in range(len(cells))]
    boot = np.stack([resampled_means(c, d) for c, d in zip(cells, draws)], axis=1)  # (R, S, O)
    reps = np.stack(_split(boot), axis=1)  # (R, 2): each replicate's (draw_std, order_std)
    lo, hi = np.quantile(reps, [0.025, 0.975], axis=0)
    return {"draw_std": draw, "draw_std_ci95": [float(lo[0]), float(hi[0])],
            "order_std": order, "order_std_ci95": [float(lo[1]), float(hi[1])],
            "n_draws": int(acc.shape[0]), "n_orders": int(acc.shape[1]), "accuracy": acc.tolist()}
