"""A synthetic in-context task family that only the context can solve.

Each episode draws a fresh rule: a random map from `n_inputs` one-letter inputs to `n_labels`
one-letter labels, each input's label uniform and independent (no dominant label by design; the
label baselines of the evaluator measure what the chance unevenness of an episode is worth). An instance is `"{x}{label}"` (the
label right after its input), demonstrations are joined by newlines. Since the rule is new in every
episode, only the context tells the labels, and only recalling the test input's *own*
demonstrations (an induction head) solves an item: with 16 inputs a test input has been seen in
context with probability 1 - (15/16)^k, so even a perfect recaller scores about 0.25 + 0.75 x
that (0.30 at 1 shot, 0.42 at 4, 0.73 at 16, 0.99 at 64). `dominant_prob` restores the old skewed family as
an ablation: there, counting labels in the context (one attention layer learns it within a few
hundred steps) already reaches the majority rate, which is a label-prior artefact, not recall.

`train_tiny_model` trains a small `EvalmModel` on such episodes on the CPU in seconds; tests and
the embedded default (`evalm eval icl` with no checkpoint) use it. Byte tokens: one character per
token, so the task needs no tokenizer file.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Sequence

import torch
from pydantic.dataclasses import dataclass

from config_toolkit import FROZEN
from icl_eval.tasks import Task

LETTERS = "abcdefghijklmnopqrstuvwxyz"
LABEL_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


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
            raise ValueError("n_inputs and n_labels must lie in 2..26")
        if self.dominant_prob is not None and not 0.0 <= self.dominant_prob <= 1.0:
            raise ValueError(f"dominant_prob must be None (uniform rule) or lie in [0, 1], got {self.dominant_prob}")


def synthetic_task(config: SyntheticConfig = SyntheticConfig()) -> Task:
    return Task(
        "synthetic", config.template, tuple(LABEL_LETTERS[: config.n_labels]),
        source=f"icl_eval.synthetic ({config.n_inputs} inputs -> {config.n_labels} labels, fresh rule per episode)",
    )


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
    fresh rule and the answer-only loss is exactly the in-context objective of `training_batch`.
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


def training_batch(rng: random.Random, config: SyntheticConfig, eos_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) byte tokens of [eos] d_1 \\n d_2 ... and targets that are -100 except at the labels."""
    rows, targets = [], []
    sizes = config.train_inputs or (config.n_inputs,)
    for _ in range(config.batch_size):
        rule = draw_rule(rng, dataclasses.replace(config, n_inputs=rng.choice(sizes)))
        inputs = list(rule)
        seq, tgt = [eos_id], [-100]
        for i in range(config.train_shots):
            x = rng.choice(inputs)
            text = ("\n" if i else "") + x
            seq += list(text.encode())
            tgt += [-100] * len(text)
            seq.append(ord(LABEL_LETTERS[rule[x]]))
            tgt.append(seq[-1])
        rows.append(seq)
        targets.append(tgt)
    tokens = torch.tensor(rows)
    # the label at position t is predicted by the logits at t - 1: shift targets left by one
    shifted = torch.full_like(tokens, -100)
    shifted[:, :-1] = torch.tensor(targets)[:, 1:]
    return tokens, shifted


def train_tiny_model(model: torch.nn.Module, config: SyntheticConfig = SyntheticConfig(), log_every: int = 0):
    """Train `model` (any module with `model(tokens, targets) -> mean loss`) on fresh episodes.

    Returns the list of losses. Deterministic for a given seed on one thread count.
    """
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.0)
    warmup = max(1, config.train_steps // 10)
    model.train()
    losses, t0 = [], time.perf_counter()
    for step in range(config.train_steps):
        for group in opt.param_groups:
            group["lr"] = config.lr * min(1.0, (step + 1) / warmup)
        tokens, targets = training_batch(rng, config, eos_id=256)
        loss = model(tokens, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if log_every and (step + 1) % log_every == 0:
            print(f"synthetic step {step + 1}/{config.train_steps} loss {loss:.4f} {time.perf_counter() - t0:.1f}s")
    model.eval()
    return losses
