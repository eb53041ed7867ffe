"""Attention transfer: EVA's new parameters trained to reproduce each layer's original attention.

LoLCATs' first stage (Zhang et al., ICLR 2025, §3.1) for a converted model (train/convert.py): the
model runs as the original does, each layer's attention output the exact causal softmax of its own
rotated heads, so every layer sees the original hidden states (teacher forcing); beside it, the
same heads go through EVA (`hf_attention.eva_attention`: window, chunk summaries with A_q/A_k) and
the squared error between the two outputs (per head, before `o_proj`) is that layer's loss. The
step's loss is the sum of the layers' mean squared errors. Only EVA's parameters (A_q, A_k, a T5
table) may train: they change no hidden state, so the rest of the forward builds no graph and the
backward runs through the attention calls alone.

Selected by `[uptrain] objective = "attention-transfer"` (train/uptrain.py): the model's attention
implementation becomes "eva_transfer" for the run, and `transfer_step` replaces the trainer's
cross-entropy step (same contract: loss, gradient norm, applied).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from evalm.hf_attention import eva_attention, register_attention
from evalm.hf_private import set_attention
from evalm.train.data import LineLoader
from evalm.train.loop import StepRecipe, finish_step
from evalm.train.parallelize import Runtime

NAME = "eva_transfer"
"""The attention implementation of a transfer run."""

EVA_PARAMETER = ".eva."
"""What the names of EVA's own parameters (A_q, A_k, the T5 table) contain."""

LOSS = "transfer_loss"
"""The attribute of an attention module that holds its layer's loss of the last forward (`transfer_attention`
writes it, `take_losses` reads and clears it): per module and per call, no state shared between models."""


def transfer_attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                       scaling: float | None = None, dropout: float = 0.0, **kwargs) -> tuple[Tensor, None]:
    """The original attention's output (B, T, H, D); EVA's squared error against it is left on the
    attention module (`LOSS`) for the step to collect."""
    student, _ = eva_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    groups = query.shape[1] // key.shape[1]
    with torch.no_grad():  # the teacher: exact causal softmax of the same rotated (grouped) heads
        teacher = F.scaled_dot_product_attention(query, key.repeat_interleave(groups, 1),
                                                 value.repeat_interleave(groups, 1), is_causal=True,
                                                 scale=scaling).transpose(1, 2)
    setattr(module, LOSS, F.mse_loss(student.float(), teacher.float()))
    return teacher.contiguous(), None


def take_losses(model: torch.nn.Module) -> list[Tensor]:
    """The layers' losses of the forward just run, in layer order, cleared from their modules (a module
    that holds none did not run: refused, so a layer skipped by some path cannot pass unnoticed)."""
    holders = [m for m in model.modules() if hasattr(m, LOSS)]
    losses = [getattr(m, LOSS) for m in holders]
    if not holders or any(loss is None for loss in losses):
        raise RuntimeError("attention transfer: a layer's attention did not run as transfer_attention")
    for m in holders:
        setattr(m, LOSS, None)
    return losses


def use_transfer(model) -> None:
    """Make a loaded EVA model run its layers as `transfer_attention` does (registered under NAME)."""
    register_attention(NAME, transfer_attention)
    set_attention(model.config, NAME)


def eva_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """EVA's own parameters (A_q, A_k, a T5 table) of a model, in name order."""
    return [p for name, p in model.named_parameters() if EVA_PARAMETER in name]


def transfer_step(model, optimizer, loader: LineLoader, runtime: Runtime,
                  recipe: StepRecipe = StepRecipe()) -> tuple[float, float, bool]:
    """One optimizer step of attention transfer (train/loop.py's `Step` contract): each micro-batch's
    loss is its layers' summed errors, averaged over micro-batches and (by FSDP's reduction) ranks."""
    grad_accum = recipe.grad_accum
    total = torch.zeros((), dtype=torch.float64, device=runtime.device)
    for _ in range(grad_accum):
        inputs, _targets = loader.next_batch()
        model(inputs.to(runtime.device), logits_to_keep=1)  # the logits are not needed: one position kept
        loss = torch.stack(take_losses(model)).sum()
        (loss / grad_accum).backward()
        total += loss.detach().double()
    if dist.is_initialized() and runtime.world_size > 1:  # [transfer note] in uptrain_model: the mean over ranks
        for p in eva_parameters(model):
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= runtime.world_size
    return finish_step(model, optimizer, runtime, total, grad_accum * runtime.world_size, recipe.clip_norm)
