"""The order of one drawn set of demonstrations, seeded apart from the draw (Bertsch et al. 2025).

The draw seed decides *which* demonstrations are in the context (`selection.dataset_level`); an
order seed decides only *how they are arranged*, so the spread over orders of the same
demonstrations can be told from the spread over draws (`spread.order_split`). Modes:
- `random`: a seeded shuffle of the drawn set;
- `label-sorted`: all demonstrations of one label together (Bertsch et al.'s `sort_by_label`), the
  labels in a seeded order and each label's members in a seeded order;
- `interleaved`: round-robin over the labels in a seeded order (one of each label, then the next
  round), so no label is far from the test input.
With no order seed (`order_seed=None`) `random` keeps the draw's own order (what the evaluator did
before order seeds existed) and the other modes arrange with the draw seed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from evalm.config_toolkit import ConfigError

ORDERS = ("random", "label-sorted", "interleaved")


def _groups(ids: Sequence[int], labels: Sequence[int], rng: random.Random) -> list[list[int]]:
    """The drawn ids grouped by label: labels in a seeded order, members shuffled within each."""
    by_label: dict[int, list[int]] = {}
    for i in ids:
        by_label.setdefault(labels[i], []).append(i)
    order = sorted(by_label)
    rng.shuffle(order)
    groups = [by_label[lab] for lab in order]
    for g in groups:
        rng.shuffle(g)
    return groups


def arrange(ids: Sequence[int], labels: Sequence[int], mode: str, order_seed: int | None,
            draw_seed: int = 0) -> list[int]:
    """The drawn training indices `ids` in the order `mode` gives; `labels[i]` is item i's gold label."""
    if mode not in ORDERS:
        raise ConfigError(f"order {mode!r} is not known; valid: {', '.join(ORDERS)}")
    if mode == "random" and order_seed is None:
        return list(ids)
    rng = random.Random(f"order-{draw_seed if order_seed is None else order_seed}")
    if mode == "random":
        out = list(ids)
        rng.shuffle(out)
        return out
    groups = _groups(ids, labels, rng)
    if mode == "label-sorted":
        return [i for g in groups for i in g]
    out = []
    for r in range(max((len(g) for g in groups), default=0)):
        out += [g[r] for g in groups if r < len(g)]
    return out
