"""Label baselines and the hierarchical bootstrap against hand computations and normal theory.

    python -m pytest tests/icl_eval/test_baselines.py -q
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from evalm.icl_eval.stats.baselines import label_baselines
from evalm.icl_eval.stats.bootstrap import hierarchical_interval, interval_summary


def test_baselines_match_a_hand_count():
    gold = [0, 1, 2, 1]
    demos = [[0, 0, 1], [1, 2, 2], [2], [1, 1, 0, 0, 1]]
    out = label_baselines(gold, demos, [3, 3, 3, 3], seed=7)
    # in-context majority by hand: 0, 2, 2, 1 (no ties) -> correct, wrong, correct, correct
    assert out["in_context_majority"].tolist() == [1.0, 0.0, 1.0, 1.0]
    # the test-set majority label is 1 (twice): right on items 1 and 3
    assert out["test_majority"].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert out["chance"].tolist() == pytest.approx([1 / 3] * 4)


def test_in_context_majority_equals_an_independent_count_with_seeded_ties():
    rng = np.random.default_rng(0)
    gold = rng.integers(0, 4, 300).tolist()
    demos = [rng.integers(0, 4, rng.integers(0, 9)).tolist() for _ in gold]
    a = label_baselines(gold, demos, [4] * len(gold), seed=3)["in_context_majority"]
    b = label_baselines(gold, demos, [4] * len(gold), seed=3)["in_context_majority"]
    assert (a == b).all()  # the seed fixes every tie-break
    for g, d, hit in zip(gold, demos, a):
        counts = Counter(d)
        top = max((counts.get(k, 0) for k in range(4)))
        tied = [k for k in range(4) if counts.get(k, 0) == top]
        if len(tied) == 1:  # unambiguous: the count alone decides
            assert hit == float(g == tied[0])
        elif g not in tied:  # whatever the tie-break chose, it cannot be the gold label
            assert hit == 0.0
    # no demonstrations: every label ties, a seeded uniform guess near chance
    guess = label_baselines(gold, [[]] * len(gold), [4] * len(gold), seed=5)["in_context_majority"]
    assert 0.15 < guess.mean() < 0.35


def test_single_seed_interval_matches_the_binomial_standard_error():
    rng = np.random.default_rng(1)
    items = (rng.random(400) < 0.7).astype(float)
    lo, hi = hierarchical_interval([items], [list(range(400))], replicates=4000)
    p = items.mean()
    normal_width = 2 * 1.96 * math.sqrt(p * (1 - p) / len(items))
    assert hi - lo == pytest.approx(normal_width, rel=0.15)
    assert lo < p < hi


def test_seed_spread_widens_the_interval_far_beyond_a_pooled_binomial():
    rng = np.random.default_rng(2)
    seeds = [(rng.random(1000) < p).astype(float) for p in (0.2, 0.5, 0.8)]
    ids = [list(range(1000))] * 3
    lo, hi = hierarchical_interval(seeds, ids)
    pooled = np.concatenate(seeds)
    pooled_width = 2 * 1.96 * math.sqrt(pooled.mean() * (1 - pooled.mean()) / len(pooled))
    # resampling the 3 seed means (0.2, 0.5, 0.8): sd of their mean ~ sqrt(0.06 / 3) = 0.14
    assert hi - lo > 0.3 > 5 * pooled_width
    summary = interval_summary(seeds, ids)
    assert summary["per_seed"] == pytest.approx([s.mean() for s in seeds])
    assert summary["seed_std"] == pytest.approx(np.std([s.mean() for s in seeds], ddof=1))


def test_nested_design_resamples_items_within_each_seed():
    rng = np.random.default_rng(3)
    seeds = [(rng.random(n) < 0.5).astype(float) for n in (50, 80, 120)]
    ids = [list(range(n)) for n in (50, 80, 120)]  # different items per seed (a fresh episode each)
    lo, hi = hierarchical_interval(seeds, ids)
    assert lo < np.mean([s.mean() for s in seeds]) < hi


def test_a_paired_difference_of_identical_vectors_is_exactly_zero():
    rng = np.random.default_rng(4)
    seeds = [(rng.random(200) < 0.6).astype(float) for _ in range(3)]
    lo, hi = hierarchical_interval([s - s for s in seeds], [list(range(200))] * 3)
    assert lo == hi == 0.0
