"""Label baselines beside every accuracy (docs/evaluation.md): what a model scores without reading inputs.

For the exact test items and demonstrations of one (split, seed, shots) cell, each baseline is a
per-item correctness vector, so it can be bootstrapped and compared item by item with a method:

- `chance`: 1 / (number of candidates) for each item (its expected correctness under a uniform guess);
- `test_majority`: always answer the most frequent gold label of the items scored (a label prior
  that knows the test set: the ceiling of any label-prior artefact);
- `in_context_majority`: answer the most frequent label among the item's own demonstrations (what
  counting labels in the context achieves without reading the test input).

Ties are broken by a `random.Random` seeded with the evaluator's seed, so the numbers are
reproducible. With no demonstrations every label ties, and the in-context majority is a seeded
uniform guess.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import numpy as np

NAMES = ("chance", "test_majority", "in_context_majority")


def _majority(labels: Sequence[int], n_labels: int, rng: random.Random) -> int:
    counts = Counter(labels)
    top = max((counts.get(k, 0) for k in range(n_labels)), default=0)
    return rng.choice([k for k in range(n_labels) if counts.get(k, 0) == top])


def label_baselines(gold: Sequence[int], demo_labels: Sequence[Sequence[int]], n_candidates: Sequence[int],
                    seed: int) -> dict[str, np.ndarray]:
    """Per-item correctness (floats in [0, 1]) of each baseline in `NAMES`.

    gold: the gold index of each test item; demo_labels: the gold labels of each item's own
    demonstrations (in prompt order); n_candidates: each item's number of candidates.
    """
    if not (len(gold) == len(demo_labels) == len(n_candidates)):
        raise ValueError("gold, demo_labels and n_candidates must have one entry per test item")
    rng = random.Random(seed)
    gold_arr = np.asarray(gold)
    n_labels = max(n_candidates, default=1)
    majority = _majority(list(gold), n_labels, rng)
    in_context = np.array([_majority(list(d), n, rng) for d, n in zip(demo_labels, n_candidates)])
    return {
        "chance": 1.0 / np.asarray(n_candidates, dtype=float),
        "test_majority": (gold_arr == majority).astype(float),
        "in_context_majority": (gold_arr == in_context).astype(float),
    }
