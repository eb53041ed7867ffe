"""Attention dropout on the fused CPU kernel's parts (evalm/flash.py; docs/eva.md, "Attention dropout"):
`Dropped`, the `flash_sweep.Parts` with dropout, walked by the same passes as the exact parts.

The kernel has no dropout, but a dropped key is a −inf in its additive mask, and every logit's
keep decision is a hash of its indices (evalm/dropout_mask.py) that any tile regenerates. Each
part runs twice in forward (with the mask: the kept keys' output and log-sum-exp; without: the
undropped log-sum-exp, which backward keeps) and twice in backward (`Dropped.backward_of`).
`parts(x)` gives the fused path its parts: `Dropped` when the call drops, else the exact ones.

Legend: as evalm/flash.py; m_ij ∈ {0, 1/(1 − p)} the scaled keep mask, P the joint softmax.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from evalm import dropout_mask, flash, flash_sweep
from evalm.flash import Kernel, Local, Part, PartGrad
from evalm.operands import Operands, Outputs


@dataclass(frozen=True)
class MaskKeys:
    """The dropout mask's per-query and per-key hashes of one sequence batch, computed once per pass
    (evalm/dropout_mask.py), so each kernel call's mask is one `additive_of` over its tile."""

    rows: Tensor  # (B, H, N) int32: `row_keys` of every (sequence, head, position)
    tokens: Tensor  # (N,) int32: `key_keys` of every token position
    chunks: Tensor  # (C,) int32: `key_keys` of every chunk summary
    dtype: torch.dtype  # of the additive masks: fp32 for bf16 inputs, as every mask here
    zeros: dict  # zero tensors by (shape, dtype): the O or v a backward call reads as zero (`Dropped.backward_of`)
    scratch: list  # two flat int32 buffers the masks are computed in, grown to the largest tile

    def buffers(self, shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
        """The scratch buffers, at least as large as a tile of `shape`."""
        n = math.prod(shape)
        if self.scratch[0].numel() < n:
            self.scratch[:] = [torch.empty(n, dtype=torch.int32) for _ in range(2)]
        return self.scratch[0], self.scratch[1]

    def zero(self, like: Tensor) -> Tensor:
        """A zero tensor of like's shape and dtype, allocated once per pass (the kernel only reads it;
        a stride-0 expanded zero gives it wrong results)."""
        key = (tuple(like.shape), like.dtype)
        if key not in self.zeros:
            self.zeros[key] = like.new_zeros(like.shape)
        return self.zeros[key]

    @classmethod
    def of(cls, x: Operands) -> MaskKeys:
        B, N, H, _ = x.q.shape
        rows = dropout_mask.row_keys(x.t.seed, torch.arange(B).view(B, 1, 1), torch.arange(H).view(1, H, 1), torch.arange(N))
        chunks = dropout_mask.key_keys(dropout_mask.chunk_key(torch.arange(x.rk.shape[-2])))
        return cls(rows, dropout_mask.key_keys(torch.arange(N)), chunks, flash.accumulation_dtype(x.q), {},
                   [torch.empty(0, dtype=torch.int32)] * 2)

    def local(self, x: Operands, call: Local) -> Tensor:
        """The call's (G, H, w, keys) additive mask with attention dropout: the block mask where the
        key is kept, −inf where dropped (a view of the scratch buffers). Block g of the call is block
        b0 + g % (b1 − b0) of sequence g // (b1 − b0) (or of `call.seq`), as `flash.block_rows` lays them out."""
        w, n = x.t.window, call.b1 - call.b0
        base = flash.block_mask(x, call)
        rows = self.rows[:, :, call.b0 * w : call.b1 * w] if call.seq is None else self.rows[call.seq : call.seq + 1, :, call.b0 * w : call.b1 * w]
        rows = rows.unflatten(-1, (n, w)).transpose(1, 2).flatten(0, 1)  # (G, H, w)
        first_key = torch.arange(call.b0, call.b1) * w + w - base.shape[-1]  # ext before the block, or its own first row
        cols = self.tokens[first_key[:, None] + torch.arange(base.shape[-1])].repeat(len(rows) // n, 1)  # (G, keys)
        shape = (*rows.shape, base.shape[-1])
        drop = dropout_mask.additive_of(rows.unsqueeze(-1), cols[:, None, None, :], x.t.dropout, self.dtype, self.buffers(shape))
        return drop.add_(base)  # −inf + anything stays −inf

    def remote(self, x: Operands, part: Part) -> Tensor:
        """The (B, H, R, chunks) additive mask of a remote part with attention dropout: the part's own
        mask (none for the prefix, the staircase for the tail) where kept, −inf where dropped; a view of
        the scratch buffers, valid until the next mask."""
        rows = self.rows[..., part.group.r0 : part.group.r1, None]
        width = part.chunks.stop - part.chunks.start
        drop = dropout_mask.additive_of(rows, self.chunks[part.chunks], x.t.dropout, self.dtype,
                                        self.buffers((*rows.shape[:-1], width)))
        return drop.add_(part.mask) if part.mask is not None else drop


def _kept_lse(lse: Tensor, drop: Tensor) -> Tensor:
    """ℓ of the kept keys, −inf for a row that keeps none (the kernel reports 0 there)."""
    return lse.masked_fill_(drop.amax(-1) == float("-inf"), float("-inf"))


@dataclass(frozen=True)
class Dropped:
    """The parts with attention dropout at the call's rate and seed (x.t.dropout, x.t.seed)."""

    keys: MaskKeys

    @classmethod
    def of(cls, x: Operands) -> Dropped:
        return cls(MaskKeys.of(x))

    def forward(self, x: Operands) -> tuple[Tensor, Tensor]:
        """The exact parts' forward with attention dropout on the joint probabilities P (docs/eva.md,
        "Attention dropout").

        Each part runs twice: with the dropout mask, for the kept keys' output o′_p and log-sum-exp
        ℓ′_p, and as without dropout, for ℓ_p (its output unused). Then o = e^(ℓ′ − ℓ)/(1 − p) · o′,
        with o′, ℓ′ merged over the parts like the exact outputs, and ℓ = log Σ_p e^ℓ_p the joint
        softmax's: every kept probability is P_ij/(1 − p), every dropped one 0. The calls for ℓ_p are
        the exact parts' own (no mask to build), local ones a range at a time (one call over all blocks
        would return a sequence-sized output only to drop it); the masked ones run a range (local) or
        a backward-sized group (remote) at a time, so each mask stays as small as backward's transients.
        """
        exact = flash_sweep.Sweep(flash_sweep.ROWS, ranged=True, outputs=False)
        _, lse = flash_sweep.sweep(x, flash_sweep.EXACT, exact)
        masked = flash_sweep.Sweep(flash_sweep.BACKWARD_ROWS, flash_sweep.BACKWARD_CHUNKS, ranged=True)
        kept_out, kept_lse = flash_sweep.sweep(x, self, masked)
        factor = (kept_lse - lse).exp_().mul_(dropout_mask.scale(x.t.dropout))  # a row that kept nothing: 0
        return kept_out.mul_(factor.unsqueeze(-1)).to(x.q.dtype), lse

    def local_forward(self, x: Operands, call: Local) -> tuple[Tensor, Tensor]:
        drop = self.keys.local(x, call)
        o, lse = flash.local_kernel(x, call, drop).forward(x.t.scale)
        return o, _kept_lse(lse, drop)

    def remote_forward(self, x: Operands, part: Part, q_g: Tensor) -> tuple[Tensor, Tensor]:
        drop = self.keys.remote(x, part)
        o, lse = flash.remote_kernel(x, q_g, part.chunks, drop).forward(x.t.scale)
        return o, _kept_lse(lse, drop)

    def local_backward(self, x: Operands, y: Outputs, call: Local) -> tuple[Tensor, Tensor, Tensor]:
        kernel = flash.local_kernel(x, call, flash.local_mask(x, call))
        return self.backward_of(x, kernel, flash.local_grad(x, y, call), self.keys.local(x, call))

    def remote_backward(self, x: Operands, part: Part, q_g: Tensor, grad: PartGrad) -> tuple[Tensor, Tensor, Tensor]:
        kernel = flash.remote_kernel(x, q_g, part.chunks, part.mask)
        return self.backward_of(x, kernel, grad, self.keys.remote(x, part))

    def backward_of(self, x: Operands, kernel: Kernel, grad: PartGrad, drop: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """A part's dq, dk, dv with attention dropout, from two kernel backward calls.

        With o = Σ_j P_ij m_ij v_j (m: 0 or 1/(1 − p)), the gradient of the logits is
        dS_ij = P_ij (m_ij dP_ij − D_i), D_i = dO_i·o_i. The kernel computes P̂ ∘ (dP − rowsum(dO ∘ O))
        with P̂ = exp(s + mask − L) for the O and L it is given, so
          the dropout mask `drop`, L = ℓ + log(1 − p), O = 0:  P̂ = P·m, D = 0 → P m dP, and dv = (P m)ᵀ dO;
          the part's own mask (`kernel`), L = ℓ, O = o, v = 0:  P̂ = P, dP = 0 → −P D."""
        kept = grad._replace(out=self.keys.zero(grad.out), lse=grad.lse + math.log1p(-x.t.dropout))
        d_q, d_k, d_v = kernel._replace(mask=drop, causal=False).backward(x.t.scale, kept)
        d_q2, d_k2, _ = kernel._replace(v=self.keys.zero(kernel.v)).backward(x.t.scale, grad)
        return d_q.add_(d_q2), d_k.add_(d_k2), d_v


def parts(x: Operands) -> flash_sweep.Parts:
    """The fused path's parts for the call: with attention dropout at its rate and seed, or exact."""
    return Dropped.of(x) if x.t.dropout > 0 else flash_sweep.EXACT
