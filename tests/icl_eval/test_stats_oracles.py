"""The evaluation's statistics against plain computations of their definitions, float for float:
the bootstrap interval and the order/draw split (computed a block of replicates at once) against one
replicate per loop step with the same generator, and macro-F1 against scikit-learn's `f1_score`.

Run: python -m pytest tests/icl_eval/test_stats_oracles.py -q
"""

from __future__ import annotations

import numpy as np
import pytest

from evalm.icl_eval.methods.scoring import metrics
from evalm.icl_eval.stats import bootstrap
from evalm.icl_eval.stats.bootstrap import hierarchical_interval
from evalm.icl_eval.stats.spread import order_split


def looped_interval(values, item_ids, replicates=2000, seed=0):
    """Each replicate on its own: the seeds resampled, then the items (one draw shared by the seeds when they
    score the same items, else a draw inside each chosen seed)."""
    cells = [np.asarray(v, dtype=float) for v in values]
    rng = np.random.default_rng(seed)
    chosen = rng.integers(0, len(cells), size=(replicates, len(cells)))
    if all(list(ids) == list(item_ids[0]) for ids in item_ids):
        matrix = np.stack(cells)
        draws = rng.integers(0, matrix.shape[1], size=(replicates, matrix.shape[1]))
        per_seed = np.stack([matrix[:, d].mean(axis=1) for d in draws])  # (R, S)
        stats = np.take_along_axis(per_seed, chosen, axis=1).mean(axis=1)
    else:
        slots = np.empty((replicates, len(cells)))
        for s, cell in enumerate(cells):
            rows, cols = np.nonzero(chosen == s)
            draws = rng.integers(0, len(cell), size=(len(rows), len(cell)))
            for row, col, d in zip(rows, cols, draws):
                slots[row, col] = cell[d].mean()
        stats = slots.mean(axis=1)
    tail = (1.0 - 0.95) / 2  # as the module writes it: 0.025000000000000022
    lo, hi = np.quantile(stats, [tail, 1.0 - tail])
    return float(lo), float(hi)


def looped_split(correct, item_ids, replicates=1000, seed=0):
    """(draw_std, order_std) intervals, one replicate per step."""
    def split(acc):
        order = float(np.sqrt(acc.var(axis=1, ddof=1).mean())) if acc.shape[1] > 1 else 0.0
        return (float(acc.mean(axis=1).std(ddof=1)) if acc.shape[0] > 1 else 0.0), order

    cells = [np.asarray(c, dtype=float) for c in correct]
    rng = np.random.default_rng(seed)
    crossed = all(list(ids) == list(item_ids[0]) for ids in item_ids)
    reps = []
    for _ in range(replicates):
        shared = rng.integers(0, cells[0].shape[1], cells[0].shape[1]) if crossed else None
        reps.append(split(np.stack([c[:, shared if crossed else rng.integers(0, c.shape[1], c.shape[1])].mean(axis=1)
                                    for c in cells])))
    lo, hi = np.quantile(np.array(reps), [0.025, 0.975], axis=0)
    return [float(lo[0]), float(hi[0])], [float(lo[1]), float(hi[1])]


def designs(rng):
    """(per-seed item counts, item ids) for crossed and nested designs of one to four seeds."""
    for seeds in (1, 2, 4):
        n = int(rng.integers(1, 40))
        yield [n] * seeds, [list(range(n))] * seeds
        sizes = [int(rng.integers(1, 20)) for _ in range(seeds)]
        starts = np.cumsum([0, *sizes])
        yield sizes, [list(range(starts[i], starts[i + 1])) for i in range(seeds)]


@pytest.mark.parametrize("kind", ["correct", "scores"])
def test_the_interval_is_the_one_replicate_at_a_time_interval(kind):
    rng = np.random.default_rng(1)
    for sizes, ids in designs(rng):
        values = [rng.integers(0, 2, n).astype(float) if kind == "correct" else rng.normal(size=n) for n in sizes]
        assert hierarchical_interval(values, ids, seed=3) == looped_interval(values, ids, seed=3), (sizes, kind)


def test_a_split_larger_than_one_block_gives_the_same_interval(monkeypatch):
    """Large test splits are resampled a block of replicates at a time: the blocks change nothing."""
    rng = np.random.default_rng(2)
    values, ids = [rng.normal(size=300) for _ in range(3)], [list(range(300))] * 3
    monkeypatch.setattr(bootstrap, "BLOCK_VALUES", 1000)
    assert hierarchical_interval(values, ids) == looped_interval(values, ids)


def test_the_order_split_is_the_one_replicate_at_a_time_split():
    rng = np.random.default_rng(4)
    for orders in (1, 2, 3):
        for sizes, ids in designs(rng):
            correct = [rng.integers(0, 2, (orders, n)) for n in sizes]
            got = order_split(correct, ids, seed=5)
            draw, order = looped_split(correct, ids, seed=5)
            assert (got["draw_std_ci95"], got["order_std_ci95"]) == (draw, order), (orders, sizes)


def test_macro_f1_is_scikit_learns():
    f1_score = pytest.importorskip("sklearn.metrics").f1_score
    rng = np.random.default_rng(6)
    for _ in range(300):
        n, labels = int(rng.integers(1, 60)), int(rng.integers(1, 6))
        gold = rng.integers(-1, labels, n)  # -1: no gold label, left out
        pred = np.where(rng.random(n) < 0.5, gold, rng.integers(0, labels + 1, n))
        known = gold >= 0
        got = metrics(list(pred), list(gold))
        if known.any():
            assert got["macro_f1"] == float(f1_score(gold[known], pred[known], average="macro")), (gold, pred)
            assert got["n"] == int(known.sum())
