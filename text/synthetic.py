"""The synthetic in-context family as plain data: rules, episodes and instruction rows (no torch).

Each episode draws a fresh rule: a random map from `n_inputs` one-letter inputs to `n_labels`
one-letter labels, each input's label uniform and independent (no dominant label by design; the
label baselines of the evaluator measure what the chance unevenness of an episode is worth). Since
the rule is new in every episode, only the context tells the labels, and only recalling the test
input's *own* demonstrations (an induction head) solves an item (docs/evaluation.md, "The
synthetic family"). `dominant_prob` restores the old skewed family as an ablation.

[floor note] The family lives here, on the ground floor, because three floors use it: `train/`
writes tuning rows from it (`evalm train msit-data`, `evalm train metaicl`), `icl_eval/` evaluates
on its episodes (`icl_eval.tasks.synthetic` adds the task, byte batches and the tiny model), and neither
may import the other (the floors of tests/test_house.py). It is pure Python: rows, not tensors.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence

from pydantic.dataclasses import dataclass

from evalm.config_toolkit import ConfigError, FROZEN

LETTERS = "abcdefghijklmnopqrstuvwxyz"
LABEL_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


MAX_ITEMS = 1_000_000
"""Items of one split of a synthetic episode at most (its default pool is 512)."""


@dataclass(config=FROZEN, frozen=True)
class SyntheticConfig:
    """The synthetic family and the tiny model's training run (section `[synthetic]`)."""

    n_inputs: int = 16
    """Distinct inputs per episode (letters a, b, ...)."""
    n_labels: int = 4
    """Labels per episode (letters A, B, ...)."""
    dominant_prob: float | None = None
    """None (default): every input's label uniform, so no label dominates by design and only
    recall of the test input's own demonstrations solves the task (by chance an episode's labels
    are uneven: the label baselines measure what that is worth). A probability p: the ablation
    with a dominant label per episode, which label counting alone half solves."""
    balanced: bool = False
    """With dominant_prob None: assign labels so that each names the same number of inputs."""
    n_train: int = 512
    """Training items per evaluation episode (the demonstration pool)."""
    n_test: int = 100
    """Test items per evaluation episode."""
    train_steps: int = 400
    """Optimizer steps of `train_tiny_model`."""
    train_shots: int = 40
    """Demonstrations per training sequence (every label in it is a prediction target)."""
    batch_size: int = 32
    """Sequences per step."""
    lr: float = 3e-3
    """AdamW learning rate (constant after a 10% warmup)."""
    seed: int = 0
    """Seed of the training data and the model init."""
    train_inputs: tuple[int, ...] = ()
    """Rule sizes that `train_tiny_model`'s sequences draw from (e.g. 2, 4, 8, 16): small rules let
    the recall circuit form early (see `instruction_examples`); empty: `n_inputs` only."""
    template: str = "{x}{label}"
    """Instance template. Byte tokens need none; with a BPE tokenizer use "{x} {label}", so the
    label is its own pre-token and tokenizes the same inside a prompt as in tuning data."""

    def __post_init__(self) -> None:
        if not 2 <= self.n_inputs <= 26 or not 2 <= self.n_labels <= 26:
            raise ConfigError("n_inputs and n_labels must lie in 2..26")
        for name in ("n_train", "n_test"):  # the episode's items are made as lists: n_test = 1e12 filled memory
            if not 1 <= getattr(self, name) <= MAX_ITEMS:
                raise ConfigError(f"{name} = {getattr(self, name)}: give from 1 to {MAX_ITEMS:,} items per episode")
        if self.dominant_prob is not None and not 0.0 <= self.dominant_prob <= 1.0:
            raise ConfigError(f"dominant_prob must be None (uniform rule) or lie in [0, 1], got {self.dominant_prob}")


def draw_rule(rng: random.Random, config: SyntheticConfig) -> dict[str, int]:
    """A fresh input -> label map: each input's label uniform and independent (default), a
    balanced assignment (every label names n_inputs / n_labels inputs), or the ablation: the
    episode's dominant label with probability `dominant_prob`, else another one."""
    inputs = LETTERS[: config.n_inputs]
    if config.dominant_prob is None and config.balanced:  # each label names the same number of inputs (+-1)
        labels = [i % config.n_labels for i in range(config.n_inputs)]
        rng.shuffle(labels)
        return dict(zip(inputs, labels))
    if config.dominant_prob is None:
        return {x: rng.randrange(config.n_labels) for x in inputs}
    dominant = rng.randrange(config.n_labels)
    others = [lab for lab in range(config.n_labels) if lab != dominant]
    return {
        x: dominant if rng.random() < config.dominant_prob else rng.choice(others)
        for x in inputs
    }


def episode(seed: int, config: SyntheticConfig = SyntheticConfig()) -> dict[str, list[dict]]:
    """Train/test splits under one rule (the `seed`-th episode): items {"x": letter, "label": index}."""
    rng = random.Random(seed)
    rule = draw_rule(rng, config)
    inputs = list(rule)

    def items(n: int) -> list[dict]:
        return [{"x": x, "label": rule[x]} for x in (rng.choice(inputs) for _ in range(n))]

    return {"train": items(config.n_train), "test": items(config.n_test), "validation": items(config.n_test)}


def instruction_examples(config: SyntheticConfig, n_episodes: int, per_episode: int, seed: int,
                         inputs_per_episode: Sequence[int] = ()) -> list[dict]:
    """Many-shot instruction data: `{"task", "input", "output"}` rows, one task per episode (rule).

    MSIT packs a task's examples into one line (EVALM §3.2), so each line is an episode of one
    fresh rule and the answer-only loss is exactly the in-context objective of `icl_eval.tasks.synthetic.training_batch`.
    Episodes draw their rules from `seed`, disjoint from the evaluation episodes' small seeds.
    `inputs_per_episode` cycles the episodes through rules of several sizes (e.g. 2, 4, 8, 16
    inputs): in small rules an input recurs within a few examples, inside EVA's exact local
    window, so the recall circuit (an induction head) forms within a few hundred steps and then
    serves the large rules through the chunk summaries; on 16-input rules alone it did not form
    in 1,200 steps (docs/evaluation.md, "The synthetic family").
    """
    rng = random.Random(seed)
    sizes = list(inputs_per_episode) or [config.n_inputs]
    rows = []
    for k in range(n_episodes):
        rule = draw_rule(rng, dataclasses.replace(config, n_inputs=sizes[k % len(sizes)]))
        inputs = list(rule)
        for _ in range(per_episode):
            x = rng.choice(inputs)
            rows.append({"task": f"synthetic-{k:05d}", "input": x, "output": LABEL_LETTERS[rule[x]]})
    return rows
