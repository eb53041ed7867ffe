"""Attention dropout on the fused CPU kernel's parts (evalm/flash.py; docs/eva.md, "Attention dropout").

The kernel has no dropout, but a dropped key is a −inf in its additive mask, and every logit's
keep decision is a hash of its indices (evalm/dropout_mask.py) that any tile regenerates. Each
part runs twice in forward (with the mask: the kept keys' output and log-sum-exp; without: the
undropped log-sum-exp, which backward keeps) and twice in backward (`_dropped_backward`).
`forward` replaces `flash.forward`; `parts(t, q, C)` gives `flash.backward` the parts' backward.

Legend: as evalm/flash.py; m_ij ∈ {0, 1/(1 − p)} the scaled keep mask, P the joint softmax.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
from torch import Tensor

from evalm import dropout_mask, flash
from evalm.tiling import Tiling


class MaskKeys(NamedTuple):
    """The dropout mask's per-query and per-key hashes of one sequence batch, computed once per pass
    (evalm/dropout_mask.py), so each kernel call's mask is one `keep_of` over its tile."""

    rows: Tensor  # (B, H, N) int32: `row_keys` of every (sequence, head, position)
    tokens: Tensor  # (N,) int32: `key_keys` of every token position
    chunks: Tensor  # (C,) int32: `key_keys` of every chunk summary
    dtype: torch.dtype  # of the additive masks: fp32 for bf16 inputs, as every mask here
    zeros: dict  # zero tensors by (shape, dtype): the O or v a backward call reads as zero (`_dropped_backward`)
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
    def of(cls, t: Tiling, q: Tensor, C: int) -> MaskKeys:
        B, N, H, _ = q.shape
        rows = dropout_mask.row_keys(t.seed, torch.arange(B).view(B, 1, 1), torch.arange(H).view(1, H, 1), torch.arange(N))
        return cls(rows, dropout_mask.key_keys(torch.arange(N)), dropout_mask.key_keys(dropout_mask.chunk_key(torch.arange(C))),
                   flash.accumulation_dtype(q), {}, [torch.empty(0, dtype=torch.int32)] * 2)


def _local_drop_mask(t: Tiling, bias: Tensor | None, call: flash.Local, keys: MaskKeys) -> Tensor:
    """The call's (G, H, w, keys) additive mask with attention dropout: the block mask where the
    key is kept (evalm/dropout_mask.py), −inf where dropped (a view of the scratch buffers). Block g of the call is block
    b0 + g % (b1 − b0) of sequence g // (b1 − b0) (or of `call.seq`), as `flash._rows` lays them out."""
    w, n = t.window, call.b1 - call.b0
    base = t.local_mask(bias, keys.rows.device, keys.dtype)
    base = base[:, t.ext :] if call.b0 == 0 else base  # as `flash._local_mask`
    rows = keys.rows[:, :, call.b0 * w : call.b1 * w] if call.seq is None else keys.rows[call.seq : call.seq + 1, :, call.b0 * w : call.b1 * w]
    rows = rows.unflatten(-1, (n, w)).transpose(1, 2).flatten(0, 1)  # (G, H, w)
    first_key = torch.arange(call.b0, call.b1) * w + w - base.shape[-1]  # ext before the block, or its own first row
    cols = keys.tokens[first_key[:, None] + torch.arange(base.shape[-1])].repeat(len(rows) // n, 1)  # (G, keys)
    shape = (*rows.shape, base.shape[-1])
    drop = dropout_mask.additive_of(rows.unsqueeze(-1), cols[:, None, None, :], t.dropout, keys.dtype, keys.buffers(shape))
    return drop.add_(base)  # −inf + anything stays −inf


def _remote_drop_mask(t: Tiling, g: flash.Remote, chunks: slice, mask: Tensor | None, keys: MaskKeys) -> Tensor:
    """The (B, H, R, chunks) additive mask of a remote part with attention dropout: the part's own
    mask (none for the prefix, the staircase for the tail) where kept, −inf where dropped; a view of
    the scratch buffers, valid until the next mask."""
    rows = keys.rows[..., g.r0 : g.r1, None]
    drop = dropout_mask.additive_of(rows, keys.chunks[chunks], t.dropout, keys.dtype,
                                    keys.buffers((*rows.shape[:-1], chunks.stop - chunks.start)))
    return drop.add_(mask) if mask is not None else drop


def _kept_lse(lse: Tensor, drop: Tensor) -> Tensor:
    """ℓ of the kept keys, −inf for a row that keeps none (the kernel reports 0 there)."""
    return lse.masked_fill_(drop.amax(-1) == float("-inf"), float("-inf"))


def forward(t: Tiling, q: Tensor, k: Tensor, v: Tensor, rk: Tensor, rv: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor]:
    """`flash.forward` with attention dropout on the joint probabilities P (docs/eva.md, "Attention dropout").

    The kernel has no dropout, but a dropped key is a −inf in its additive mask. Each part runs twice:
    with the dropout mask, for the kept keys' output o′_p and log-sum-exp ℓ′_p, and as without
    dropout, for ℓ_p (its output unused). Then o = e^(ℓ′ − ℓ)/(1 − p) · o′, with o′, ℓ′ merged over the
    parts like `flash.forward`'s outputs, and ℓ = log Σ_p e^ℓ_p the joint softmax's: every kept
    probability is P_ij/(1 − p), every dropped one 0. The remote calls for ℓ_p are `flash.forward`'s
    own (no mask to build); the masked ones run a range (local) or a backward-sized group (remote)
    at a time, so each mask stays as small as backward's transients.
    """
    B, N, H, D = q.shape
    w = t.window
    work = flash.accumulation_dtype(q)
    kept_out, kept_lse, lse = q.new_empty(B, N, H, D, dtype=work), q.new_empty(B, N, H, dtype=work), q.new_empty(B, N, H, dtype=work)
    keys = MaskKeys.of(t, q, rk.shape[-2])
    # ℓ_p: the kernel calls of `flash.forward` (their outputs unused), local ones a range at a time
    # (one call over all blocks would return a sequence-sized output only to drop it)
    for r in flash._ranges(t, N // w):
        for call in flash._local_calls(t, B, r.b0, r.b1, N // w):
            flash._rows(lse, call, w).copy_(flash._local_forward(t, call, q, k, v, bias)[1])
    rk, rv = rk.to(q.dtype), rv.to(q.dtype)
    for g in flash._remote_groups(t, 0, N, rk.shape[-2], flash.ROWS):
        q_g = q[:, g.r0 : g.r1].transpose(1, 2)
        for chunks, mask, seen in flash._parts(t, g, q):
            _, part_lse = flash._FWD(q_g, rk[..., chunks, :], rv[..., chunks, :], attn_mask=mask, scale=t.scale)
            if seen is not None:
                part_lse.masked_fill_(~seen, float("-inf"))
            lse[:, g.r0 : g.r1] = torch.logaddexp(lse[:, g.r0 : g.r1], part_lse.transpose(1, 2))
    # o′_p, ℓ′_p: the same parts with the dropout mask, in tiles as small as backward's
    for r in flash._ranges(t, N // w)[::-1]:
        for call in flash._local_calls(t, B, r.b0, r.b1, N // w):
            q_c, k_c, v_c = (x.to(work) for x in (flash._rows(q, call, w), flash._keys(k, t, call), flash._keys(v, t, call)))
            drop = _local_drop_mask(t, bias, call, keys)
            o, part_kept = flash._FWD(q_c, k_c, v_c, attn_mask=drop, scale=t.scale)
            flash._rows(kept_out, call, w).copy_(o)
            flash._rows(kept_lse, call, w).copy_(_kept_lse(part_kept, drop))
    for g in flash._remote_groups(t, 0, N, rk.shape[-2], flash.BACKWARD_ROWS):
        q_g = q[:, g.r0 : g.r1].transpose(1, 2)
        for chunks, mask, _ in flash._parts(t, g, q, piece=flash.BACKWARD_CHUNKS):
            drop = _remote_drop_mask(t, g, chunks, mask, keys)
            o, part_kept = flash._FWD(q_g, rk[..., chunks, :], rv[..., chunks, :], attn_mask=drop, scale=t.scale)
            flash._merge(kept_out[:, g.r0 : g.r1], kept_lse[:, g.r0 : g.r1], o, _kept_lse(part_kept, drop))
    factor = (kept_lse - lse).exp_().mul_(dropout_mask.scale(t.dropout))  # a row that kept nothing: 0
    return kept_out.mul_(factor.unsqueeze(-1)).to(q.dtype), lse


def _dropped_backward(t: Tiling, d_out, q, k, v, out, lse, mask: Tensor | None, causal: bool, drop: Tensor,
                      keys: MaskKeys) -> tuple[Tensor, Tensor, Tensor]:
    """A part's dq, dk, dv with attention dropout, from two kernel backward calls.

    With o = Σ_j P_ij m_ij v_j (m: 0 or 1/(1 − p)), the gradient of the logits is
    dS_ij = P_ij (m_ij dP_ij − D_i), D_i = dO_i·o_i. The kernel computes P̂ ∘ (dP − rowsum(dO ∘ O))
    with P̂ = exp(s + mask − L) for the O and L it is given, so
      the dropout mask, L = ℓ + log(1 − p) and O = 0:  P̂ = P·m, D = 0 → P m dP, and dv = (P m)ᵀ dO;
      the part's own mask, L = ℓ, O = o and v = 0:      P̂ = P, dP = 0 → −P D.
    `causal`: the part's own mask is the kernel's causal one (the local part without T5 bias or overlap)."""
    d_q, d_k, d_v = flash._BWD(d_out, q, k, v, keys.zero(out), lse + math.log1p(-t.dropout), 0.0, False,
                         attn_mask=drop, scale=t.scale)
    d_q2, d_k2, _ = flash._BWD(d_out, q, k, keys.zero(v), out, lse, 0.0, causal, attn_mask=mask, scale=t.scale)
    return d_q.add_(d_q2), d_k.add_(d_k2), d_v


def _local_backward(t: Tiling, call: flash.Local, q, k, v, bias, out, lse, d_out, keys: MaskKeys) -> tuple[Tensor, Tensor, Tensor]:
    """`flash._local_backward` with attention dropout (`_dropped_backward`)."""
    w, work = t.window, flash.accumulation_dtype(q)
    mask = flash._local_mask(t, bias, call, q)
    rows, keys_of = flash._rows, flash._keys
    return _dropped_backward(t, rows(d_out, call, w).to(work), rows(q, call, w).to(work), keys_of(k, t, call).to(work),
                             keys_of(v, t, call).to(work), rows(out, call, w).to(work), rows(lse, call, w),
                             mask, mask is None, _local_drop_mask(t, bias, call, keys), keys)


def _remote_backward(t: Tiling, g: flash.Remote, chunks: slice, mask: Tensor | None, d_out, q, k, v, out, lse,
                     keys: MaskKeys) -> tuple[Tensor, Tensor, Tensor]:
    """`flash._remote_backward` with attention dropout: one remote part's dq, d k̃, d β."""
    return _dropped_backward(t, d_out, q, k, v, out, lse, mask, False, _remote_drop_mask(t, g, chunks, mask, keys), keys)


def parts(t: Tiling, q: Tensor, n_chunks: int) -> flash.PartBackward:
    """The parts' backward for `flash.backward`, with the dropout mask of (t.seed, t.dropout)."""
    keys = MaskKeys.of(t, q, n_chunks)
    return flash.PartBackward(functools.partial(_local_backward, keys=keys), functools.partial(_remote_backward, keys=keys))
