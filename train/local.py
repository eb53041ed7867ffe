"""One-process training in the one loop: no process group, no checkpoints, no files.

For a model trained in seconds inside a command or a test (the synthetic family's tiny model,
`icl_eval.tasks.synthetic.train_tiny_model`; fine-tuning in the evaluator; the recall study's models).
The steps run in `train.loop.run_steps` with its `train_step` (the token-weighted loss, the clip,
AdamW over `weight_decay_groups`) and the LR of an `OptimConfig` (`schedule.lr_of`), exactly as in
pretraining and MSIT; this path leaves out only what a short in-memory run has no use for (FSDP,
resume, metrics files).
"""

from __future__ import annotations

from typing import Protocol

import torch

from evalm.train.loop import Loop, run_steps
from evalm.train.parallelize import Runtime


class Batches(Protocol):
    """Anything with `next_batch() -> (inputs, targets)`, both (B, T), targets IGNORE where no loss."""

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]: ...


def train_in_process(model: torch.nn.Module, batches: Batches, optimizer: torch.optim.Optimizer, loop: Loop) -> list[float]:
    """The steps of `loop` on `model` (in training mode, then back in evaluation mode) in this process, on
    the device of its parameters; their losses."""
    device = next(model.parameters()).device
    runtime = Runtime(rank=0, world_size=1, device=device, mesh=None)
    model.train()
    losses = run_steps(model, optimizer, batches, runtime, loop)
    model.eval()
    return losses
