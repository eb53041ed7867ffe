"""One-process training through the trainer's own step: no process group, no checkpoints, no files.

For a model trained in seconds inside a command or a test (the synthetic family's tiny model,
`icl_eval.tasks.synthetic.train_tiny_model`). The step is `train.trainer.train_step` (the token-weighted
loss, the clip, AdamW over `weight_decay_groups`) and the LR `train.schedule.set_lr` of an
`OptimConfig`, exactly as in pretraining and MSIT, so the project has one training loop body; this
path leaves out only what a short in-memory run has no use for (FSDP, resume, metrics files).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import torch

from evalm.train.config import OptimConfig
from evalm.train.parallelize import Runtime
from evalm.train.schedule import set_lr
from evalm.train.trainer import make_optimizer, train_step


class Batches(Protocol):
    """Anything with `next_batch() -> (inputs, targets)`, both (B, T), targets IGNORE where no loss."""

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]: ...


def train_in_process(model: torch.nn.Module, batches: Batches, optim: OptimConfig, steps: int, *,
                     log_every: int = 0, name: str = "train", start: int = 0,
                     optimizer: torch.optim.Optimizer | None = None, lr_at: Callable[[int], float] | None = None,
                     structure=None, after_step: Callable[[int, float], None] | None = None) -> list[float]:
    """Optimizer steps `start` .. `steps` - 1 of `model` (logits of `model(inputs)`, or of
    `structure.logits`, train.structure's interface) on `batches`; returns their losses.

    The optimizer is AdamW of `optim` unless one is given (a resumed run's, or a recipe of its own),
    the LR `schedule.set_lr` of `optim` unless `lr_at(step)` gives it; `after_step(done, loss)` runs
    after each step (a checkpoint: `evalm train recall`)."""
    device = next(model.parameters()).device
    runtime = Runtime(rank=0, world_size=1, device=device, mesh=None)
    optimizer = make_optimizer(model, optim) if optimizer is None else optimizer
    model.train()
    losses, t0 = [], time.perf_counter()
    for step in range(start, steps):
        if lr_at is None:
            set_lr(optimizer, step, optim, steps)
        else:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
        loss, _, _ = train_step(model, optimizer, batches, runtime, 1, optim.clip_norm, structure)
        losses.append(loss)
        if after_step is not None:
            after_step(step + 1, loss)
        if log_every and (step + 1) % log_every == 0:
            print(f"{name} step {step + 1}/{steps} loss {loss:.4f} {time.perf_counter() - t0:.1f}s")
    model.eval()
    return losses
