"""The one training loop: optimizer steps from `start` to `end`, each at the LR of its step, each
followed by what its trainer does after a step (log, checkpoint, stop); and the one step it takes.

Every trainer runs its steps here: pretraining, MSIT and uptraining (train/trainer.py, which adds
FSDP, resume, metrics and checkpoints after each step), the in-process runs (train/local.py: the
synthetic family's tiny model, fine-tuning in the evaluator, the recall study's models), MetaICL
(train/metaicl.py, its own step) and the throughput benchmarks. A step is any function of the
`Step` contract: `train_step` (next-token cross-entropy), attention transfer's (train/attention_transfer.py),
MetaICL's; all of them end in `finish_step`, the project's one `optimizer.step()`.

[token mean note] With loss masks (MSIT) ranks and micro-batches hold different numbers of
targets, so a mean of per-batch means would weight tokens unequally. Each micro-batch therefore
backpropagates its loss *sum* x world / (targets in the whole step, all ranks): FSDP's
reduce-scatter averages over ranks, which turns that into the exact mean over the step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F

from evalm.train.data import IGNORE
from evalm.train.parallelize import Runtime, weight_decay_groups
from evalm.train.structure import Packed


@dataclass(frozen=True)
class StepRecipe:
    """How one optimizer step is taken: micro-batches per step, the L2 clip (0: none) and how lines
    are fed to the model (train.structure; None: packed lines)."""

    grad_accum: int = 1
    clip_norm: float = 1.0
    structure: Any = None


class Step(Protocol):
    """One optimizer step on `batches` (anything with `next_batch()`): the step's loss, the pre-clip
    gradient norm, and whether the update was applied (the same values on every rank)."""

    def __call__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: Any, runtime: Runtime,
                 recipe: StepRecipe) -> tuple[float, float, bool]: ...


@dataclass(frozen=True)
class Stepped:
    """What one step of the loop did: steps done after it, its LR (None: the optimizer's own), its
    loss, the gradient norm before the clip, whether the update was applied."""

    done: int
    lr: float | None
    loss: float
    grad_norm: float
    applied: bool


@dataclass(frozen=True)
class Loop:
    """A run of optimizer steps: which ones (`start` .. `end` - 1), the step taken and how, the LR of
    each (None: the optimizer's own, unchanged) and what runs after each (it may raise to stop)."""

    start: int
    end: int
    step: Step
    recipe: StepRecipe = StepRecipe()
    lr_at: Callable[[int], float] | None = None
    after_step: Callable[[Stepped], None] | None = None


def run_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: Any, runtime: Runtime,
              loop: Loop) -> list[float]:
    """The training loop: the steps of `loop` on `batches`; their losses."""
    losses = []
    for step in range(loop.start, loop.end):
        lr = None
        if loop.lr_at is not None:
            lr = loop.lr_at(step)
            for group in optimizer.param_groups:
                group["lr"] = lr
        loss, grad_norm, applied = loop.step(model, optimizer, batches, runtime, loop.recipe)
        losses.append(loss)
        if loop.after_step is not None:
            loop.after_step(Stepped(step + 1, lr, loss, grad_norm, applied))
    return losses


def make_optimizer(model: torch.nn.Module, ocfg) -> torch.optim.AdamW:
    """AdamW of the `[optim]` section over `weight_decay_groups` (biases and norm weights undecayed)."""
    return torch.optim.AdamW(weight_decay_groups(model, ocfg.weight_decay), lr=ocfg.lr, betas=tuple(ocfg.betas),
                             eps=ocfg.eps)


def sum_over_ranks(t: torch.Tensor) -> None:
    """all_reduce in a process group; one process without a group (train.local) holds the sum already."""
    if dist.is_initialized():
        dist.all_reduce(t)


def train_step(model, optimizer, batches, runtime: Runtime, recipe: StepRecipe = StepRecipe()) -> tuple[float, float, bool]:
    """One optimizer step of next-token cross-entropy over `recipe.grad_accum` batches; returns the step's
    mean loss over all ranks, the pre-clip grad norm, and whether the update was applied: not when the
    loss or the gradient is non-finite (the same global values on every rank, so every rank decides alike)."""
    structure = recipe.structure or Packed()
    prepared = [structure.prepare(*batches.next_batch()) for _ in range(recipe.grad_accum)]
    # collectives need tensors on the backend's device (NCCL: CUDA)
    count = torch.tensor(float(sum(int((t != IGNORE).sum()) for _, t in prepared)), device=runtime.device)
    sum_over_ranks(count)
    n_targets = max(count.item(), 1.0)  # a step with no target contributes zero gradient
    loss_sum = torch.zeros((), dtype=torch.float64, device=runtime.device)
    for inputs, targets in prepared:
        logits = structure.logits(model, inputs, runtime.device)
        micro = F.cross_entropy(logits.float().flatten(0, 1), targets.to(runtime.device).flatten(),
                                ignore_index=IGNORE, reduction="sum")
        (micro * (runtime.world_size / n_targets)).backward()  # [token mean note]
        loss_sum += micro.detach().double()
    return finish_step(model, optimizer, runtime, loss_sum, n_targets, recipe.clip_norm)


def finish_step(model, optimizer, runtime: Runtime, loss_sum: torch.Tensor, count: float,
                clip_norm: float) -> tuple[float, float, bool]:
    """After a step's backward: clip, and apply the update unless the loss (this rank's `loss_sum`,
    summed over ranks, over `count`) or the gradient norm is non-finite; the step's loss, the
    pre-clip norm, whether it was applied (the same global values on every rank)."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm if clip_norm > 0 else float("inf"))
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    sum_over_ranks(loss_sum)
    loss, norm = loss_sum.item() / count, float(grad_norm)
    applied = math.isfinite(loss) and math.isfinite(norm)
    if applied:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss, norm, applied
