"""A synthetic in-context task family that only the context can solve: its task, byte batches, tiny model.

The family itself (rules, episodes, instruction rows, `SyntheticConfig`) is plain data in
`evalm.text.synthetic`, where `train/` reads it too; it is re-exported here. Each episode draws a fresh rule: a random map from `n_inputs` one-letter inputs to `n_labels`
one-letter labels, each input's label uniform and independent (no dominant label by design; the
label baselines of the evaluator measure what the chance unevenness of an episode is worth). An instance is `"{x}{label}"` (the
label right after its input), demonstrations are joined by newlines. Since the rule is new in every
episode, only the context tells the labels, and only recalling the test input's *own*
demonstrations (an induction head) solves an item: with 16 inputs a test input has been seen in
context with probability 1 - (15/16)^k, so even a perfect recaller scores about 0.25 + 0.75 x
that (0.30 at 1 shot, 0.42 at 4, 0.73 at 16, 0.99 at 64). `dominant_prob` restores the old skewed family as
an ablation: there, counting labels in the context (one attention layer learns it within a few
hundred steps) already reaches the majority rate, which is a label-prior artefact, not recall.

`train_tiny_model` trains a small `EvalmModel` on such episodes on the CPU in seconds, through the
project's one training step (`train.local`); tests and the embedded default (`evalm eval icl` with
no checkpoint) use it. Byte tokens: one character per token, so the task needs no tokenizer file.
"""

from __future__ import annotations

import dataclasses
import random
import time

import torch

from evalm.text.synthetic import LABEL_LETTERS, LETTERS, SyntheticConfig, draw_rule, episode, instruction_examples
from evalm.icl_eval.tasks.task import Task

__all__ = ["LABEL_LETTERS", "LETTERS", "SyntheticConfig", "SyntheticBatches", "draw_rule", "episode",
           "instruction_examples", "synthetic_task", "train_tiny_model", "training_batch"]


def synthetic_task(config: SyntheticConfig = SyntheticConfig()) -> Task:
    return Task(
        "synthetic", config.template, tuple(LABEL_LETTERS[: config.n_labels]),
        source=f"icl_eval.tasks.synthetic ({config.n_inputs} inputs -> {config.n_labels} labels, fresh rule per episode)",
    )


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


class SyntheticBatches:
    """`training_batch` after `training_batch` from one seeded stream: the trainer's `next_batch`."""

    def __init__(self, config: SyntheticConfig, eos_id: int = 256):
        self.config, self.eos_id = config, eos_id
        self.rng = random.Random(config.seed)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return training_batch(self.rng, self.config, self.eos_id)


def train_tiny_model(model: torch.nn.Module, config: SyntheticConfig = SyntheticConfig(), log_every: int = 0):
    """Train `model` (logits of `model(tokens)`) on fresh episodes with the trainer's step.

    AdamW at `config.lr` without weight decay, betas (0.9, 0.999), linear warm-up over the first 10%
    of the steps then a constant LR, gradients clipped at 1.0: the `[optim]` section below, stepped
    by `train.local`. Returns the list of losses. Deterministic for a given seed on one thread count.

    [floor note] The one import of `train/` from `icl_eval/`, made here when a tiny model is trained,
    so the project has one training step. Nothing `train.local` reaches imports
    `icl_eval`, and `train/` reads the family from `evalm.text.synthetic`, so no module imports itself back.
    """
    from evalm.train.config import OptimConfig
    from evalm.train.local import train_in_process
    from evalm.train.loop import Loop, StepRecipe, make_optimizer, train_step
    from evalm.train.schedule import lr_of

    torch.manual_seed(config.seed)
    steps = config.train_steps
    optim = OptimConfig(lr=config.lr, betas=(0.9, 0.999), weight_decay=0.0, clip_norm=1.0,
                        warmup_steps=max(1, steps // 10), min_lr_ratio=1.0)
    t0 = time.perf_counter()

    def progress(stepped) -> None:
        if log_every and stepped.done % log_every == 0:
            print(f"synthetic step {stepped.done}/{steps} loss {stepped.loss:.4f} {time.perf_counter() - t0:.1f}s")

    loop = Loop(0, steps, train_step, StepRecipe(clip_norm=optim.clip_norm), lr_of(optim, steps), progress)
    return train_in_process(model, SyntheticBatches(config), make_optimizer(model, optim), loop)
