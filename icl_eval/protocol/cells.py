"""What one unit of the protocol reads (`protocol.Runner`): the items of a (draw seed, split), the
cell of one draw, and the arm a record scored. Built once and then only read, and passed to every
step, so that no step depends on what an earlier unit left behind.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from evalm.config_toolkit import ConfigError
from evalm.icl_eval.config import EvalConfig
from evalm.icl_eval.tasks.prompts import Demo, PromptBuilder, TestItem
from evalm.icl_eval.tasks.task import Task

Splits = dict[str, list[dict[str, Any]]]


def hold_out_validation(splits: Splits, n: int) -> tuple[Splits, list[int]]:
    """Use the validation split if present, else the last `n` training items (excluded from demos)."""
    if splits.get("validation"):
        return splits, []
    train = splits["train"]
    if n >= len(train):
        raise ConfigError(f"cannot hold out {n} validation items from {len(train)} training items")
    held = list(range(len(train) - n, len(train)))
    return {**splits, "validation": [train[i] for i in held]}, held


def select_items(n: int, config: EvalConfig) -> list[int]:
    """Indices of the test items to score: all of them, a seeded random sample, or the first N."""
    if config.test_items is None or config.test_items >= n:
        return list(range(n))
    if config.test_items_order == "first":
        return list(range(config.test_items))
    return sorted(random.Random(config.test_items_seed).sample(range(n), config.test_items))


@dataclass(frozen=True)
class SplitState:
    """What every unit of one (draw seed, split) shares, built once and then only read. Its two memo
    tables fill as demonstrations and gold labels are first asked for; nothing else changes."""

    seed: int
    split: str
    task: Task
    prompt: PromptBuilder
    """The draw seed's prompt builder (its labels spelled under the seed's label map)."""
    item_set: int
    """0 where seeds share the test items (a crossed design), else the seed (nested: a fresh episode
    per seed), as the data source declares; records carry it so the bootstrap resamples correctly."""
    held: list[int]
    """Training items held out as the validation split (never drawn as demonstrations)."""
    train: list[dict[str, Any]]
    indices: list[int]
    """The scored items' indices in the split (`select_items`)."""
    rows: list[dict[str, Any]]
    labels: list[int] | None
    """Every training item's gold index, for balanced draws; None otherwise."""
    _demos: dict[tuple[int, int | None], Demo] = field(default_factory=dict, repr=False, compare=False)
    _golds: dict[int, int] = field(default_factory=dict, repr=False, compare=False)

    def demo(self, i: int, label: int | None = None) -> Demo:
        """Training item `i` as a demonstration (shown with `label` instead of its own, if given)."""
        if (i, label) not in self._demos:
            self._demos[(i, label)] = self.prompt.demo(i, self.train[i], label)
        return self._demos[(i, label)]

    def gold(self, i: int) -> int:
        if i not in self._golds:
            self._golds[i] = self.task.gold(self.train[i])
        return self._golds[i]


@dataclass(frozen=True)
class Cell:
    """One draw of one unit: its split state, what its records say of it (`shots`; with a budget also
    `budget` and `prompt_tokens`), and the test items as prompted after that many shots."""

    state: SplitState
    fields: dict[str, int]
    items: list[TestItem]

    @property
    def shots(self) -> int:
        return self.fields["shots"]


@dataclass(frozen=True)
class Arm:
    """Which context a record scored: the main order (`name` ""), a further order or a nearest arm;
    the order seed it was arranged by; whether each item had its own context (`per_item_ids`)."""

    name: str = ""
    order_seed: int | None = None
    per_item_ids: bool = False
