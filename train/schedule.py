"""The learning rate as a pure function of the step (nanoGPT `get_lr`; EVALM Table 6).

Table 6 names "polynomial decay" without its parameters; fairseq/metaseq's `polynomial_decay`
warms up linearly, then decays as a power of the remaining fraction to an end LR. OPT decays
linearly (power 1) to 0.1 x LR (docs/training.md), which are the defaults in `OptimConfig`.
Because the LR depends on nothing but the step, resume needs no scheduler state beyond the step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable


def lr_at(step: int, *, lr: float, warmup_steps: int, total_steps: int, decay_power: float = 1.0,
          min_lr_ratio: float = 0.1) -> float:
    """LR for optimizer step `step` (0-based) of `total_steps`."""
    end_lr = lr * min_lr_ratio
    # 1) warm-up: linear from lr/warmup to lr, so the first step never uses a zero LR
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    # 2) past the end: hold the end LR
    decay_steps = max(1, total_steps - warmup_steps)
    if step >= total_steps:
        return end_lr
    # 3) polynomial decay of the remaining fraction, from lr down to end_lr at total_steps
    remaining = 1.0 - (step - warmup_steps) / decay_steps
    return end_lr + (lr - end_lr) * remaining**decay_power


def lr_of(ocfg, total_steps: int) -> Callable[[int], float]:
    """The LR of each step of a run of `total_steps` (`lr_at` of the `[optim]` section): a `Loop`'s `lr_at`
    (train/loop.py)."""
    return functools.partial(lr_at, lr=ocfg.lr, warmup_steps=ocfg.warmup_steps, total_steps=total_steps,
                             decay_power=ocfg.decay_power, min_lr_ratio=ocfg.min_lr_ratio)
