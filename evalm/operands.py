"""The tensors of one whole-sequence EVA attention call, as values: what every pass and part of
the paths "fused" (evalm/flash.py, evalm/flash_dropout.py) and "recompute" (evalm/recompute.py)
reads, so none of their functions takes a row of loose tensors in an order to remember.

Legend: B sequences, N tokens (a multiple of w), H heads, D head dimension, C chunks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from torch import Tensor

from evalm.tiling import Tiling


@dataclass(frozen=True)
class Operands:
    """A call's static shape and its inputs, in the working dtype of the path that runs it."""

    t: Tiling
    q: Tensor  # (B, N, H, D) queries, the projections' own layout
    k: Tensor  # (B, N, H, D) keys
    v: Tensor  # (B, N, H, D) values
    rk: Tensor  # (B, H, C, D) k̃, the chunks' remote keys
    rv: Tensor  # (B, H, C, D) β, the chunks' remote values
    bias: Tensor | None  # (w, ext + w) T5 bias of one block (query row, key column), scaled by s; None: no bias


@dataclass(frozen=True)
class Outputs:
    """What a backward pass reads besides the operands: forward's output, each query's joint
    log-sum-exp (laid out as the path's forward returned it), the output's gradient and, with
    selection, the chunks forward chose."""

    out: Tensor  # (B, N, H, D)
    lse: Tensor  # (B, N, H) on the fused path, (B, H, N) on the plain one
    d_out: Tensor  # (B, N, H, D)
    picks: Tensor | None = None  # with selection, the chunks forward chose (B, N, H, k), −1 for none (evalm/flash_selection.py)


class Gradients(NamedTuple):
    """What a whole-sequence backward returns: the gradients of q, k, v (B, N, H, D), of k̃ and β
    (B, H, C, D), of ω (B, H, C, D; None until the chunk summaries are differentiated) and of the
    T5 bias (w, ext + w; None without one, or where it needs none)."""

    dq: Tensor
    dk: Tensor
    dv: Tensor
    drk: Tensor
    d_beta: Tensor
    d_omega: Tensor | None
    d_bias: Tensor | None
