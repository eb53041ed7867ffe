"""One-process training through the trainer's own step: no process group, no checkpoints, no files.

For a model trained in seconds inside a command or a test (the synthetic family's tiny model,
`icl_eval.tasks.synthetic.train_tiny_model`). The step is `train.trainer.train_step` (the token-weighted
loss, the clip, AdamW over `weight_decay_groups`) and the LR `train.schedule.set_lr` of an
`OptimConfig`, exactly as in pretraining and MSIT, so the project has one training loop body; this
path leaves out only what a short in-memory run has no use for (FSDP, resume, metrics files).
"""

from __future__ import annotations

import time
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
                     log_every: int = 0, name: str = "train") -> list[float]:
    """`steps` optimizer steps of `model` (logits of `model(inputs)`) on `batches`; returns the losses."""
    device = next(model.parameters()).device
    runtime = Runtime(rank=0, world_size=1, device=device, mesh=None)
    optimizer = make_optimizer(model, optim)
    model.train()
    losses, t0 = [], time.perf_counter()
    for step in range(steps):
        set_lr(optimizer, step, optim, steps)
        loss, _, _ = train_step(model, optimizer, batches, runtime, 1, optim.clip_norm)
        losses.append(loss)
        if log_every and (step + 1) % log_every == 0:
            print(f"{name} step {step + 1}/{steps} loss {loss:.4f} {time.perf_counter() - t0:.1f}s")
    model.eval()
    return losses
