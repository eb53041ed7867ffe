"""EVA over a whole sequence as one `torch.autograd.Function`: the paths "fused" and "recompute".

Training and one-shot scoring take it (evalm/eva_paths.py decides). The forward keeps q, k, v, the
output and each query's log-sum-exp, nothing chunk-sized; the backward recomputes the chunk state
(k̃, ω, β, evalm/summaries.py), then the attention's gradients on PyTorch's fused CPU kernel
(evalm/flash.py) or in plain PyTorch ops (evalm/recompute.py), then differentiates k̃ and ω
through the adaptive maps. Low-precision inputs run in fp32 inside; autocast is kept out.

Pinned by tests/evalm/test_recompute.py (output and every gradient against the autograd path and
the per-token oracle, float64, both paths; gradcheck with dropout and noise) and
tests/evalm/test_oracles_long.py (n = 2,003).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from evalm import flash, flash_dropout, summaries
from evalm.heads import upcast  # softmax work in at least fp32: exp of bf16 logits loses the small weights
from evalm.recompute import attention_backward, attention_forward, local_bias_grad
from evalm.summaries import AdaptiveMaps
from evalm.tiling import Tiling


def _work(t: Tiling, q: Tensor, *rest: Tensor | None) -> list[Tensor | None]:
    """The tensors the kernels get, contiguous: bf16 as given on the fused path (the CPU kernel
    takes bf16 and accumulates in fp32; merges and gradient sums are fp32 in evalm/flash.py),
    else in at least fp32 (the plain path's own softmax arithmetic). The T5 bias (the first of
    `rest` after k and v) is always at least fp32: it is a mask, added in fp32."""
    native = t.fused and q.dtype == torch.bfloat16
    k, v, bias, *more = rest
    tensors = [q, k, v, *more]
    work = [(x if native else upcast(x)).contiguous() if x is not None else None for x in tensors]
    return [*work[:3], upcast(bias) if bias is not None else None, *work[3:]]


class ChunkKeys(NamedTuple):
    """k̃ and ω (B, H, n, D) with, in backward, the leaves autograd differentiates them by."""

    k_tilde: Tensor
    omega: Tensor
    leaves: tuple[Tensor, ...]  # the chunk means q̄, k̄ and the maps' parameters that need a gradient

    @classmethod
    def of(cls, t: Tiling, maps: AdaptiveMaps | None, n: int, q: Tensor, k: Tensor,
           params: list[Tensor] | None = None) -> ChunkKeys:
        """Computed from q, k (B, N, H, D), returned in their dtype; differentiable by the chunk
        means and `params` when these are given (backward, under `torch.enable_grad`)."""
        B, _, H, D = q.shape
        if maps is None or n == 0:
            empty = q.new_zeros(B, H, 0, D)
            return cls(empty, empty, ())
        dtype = maps.parameters()[0].dtype
        means = [summaries.chunk_means(x, n, t.chunk, dtype) for x in (q, k)]
        if params is not None:
            means = [m.detach().requires_grad_() for m in means]
        q_mean, k_mean = means
        k_tilde, omega = summaries.keys(maps, q_mean, k_mean, t.noise_seed)
        work = flash.accumulation_dtype(q)  # bf16 q: the chunk state in fp32
        return cls(k_tilde.to(work), omega.to(work), (q_mean, k_mean, *params) if params is not None else ())


class EvaRecompute(torch.autograd.Function):
    """EVA attention that keeps neither its logits nor its chunk state: the backward recomputes
    k̃, ω and β from q and k (O(n·D) work), then the logits group by group, on the fused kernel
    (evalm/flash.py) when the path is "fused", in the plain PyTorch ops above otherwise.

    β's gradient is added in place into dk and dv, and k̃ and ω are differentiated through the
    adaptive maps by a small autograd graph built in backward, so no sequence-sized product
    (k·ω, ‖k‖², weights·v or their gradients) and no chunk state outlives its use. With `consume`
    (q, k, v are the caller's private projections, used by nothing else) the fused backward writes
    dq, dk, dv over them range by range; without it, over copies."""

    @staticmethod
    def forward(ctx, q, k, v, bias, t: Tiling, maps: AdaptiveMaps | None, n_chunks: int, consume: bool, *map_params):
        q_w, k_w, v_w, bias_w = _work(t, q, k, v, bias)
        with torch.autocast(q.device.type, enabled=False):  # else bf16 autocast recasts every matmul
            chunk = ChunkKeys.of(t, maps, n_chunks, q_w, k_w)
            beta, _ = summaries.sequence_values(k_w, v_w, chunk.omega, t.chunk, t.scale)
            attend = (flash_dropout.forward if t.dropout > 0 else flash.forward) if t.fused else attention_forward
            out, lse = attend(t, q_w, k_w, v_w, chunk.k_tilde, beta, bias_w)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, bias, out, lse)
        ctx.tiling, ctx.maps, ctx.n_chunks, ctx.consume = t, maps, n_chunks, consume
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, bias, out, lse = ctx.saved_tensors
        t, maps, n = ctx.tiling, ctx.maps, ctx.n_chunks
        q_w, k_w, v_w, bias_w, out_w, do_w = _work(t, q, k, v, bias, out, d_out)
        params = [p for p, needed in zip(maps.parameters() if maps else (), ctx.needs_input_grad[8:]) if needed]
        with torch.autocast(q.device.type, enabled=False):
            with torch.enable_grad():
                chunk = ChunkKeys.of(t, maps, n, q_w, k_w, params)
            rk, omega = chunk.k_tilde.detach(), chunk.omega.detach()
            beta, weights = summaries.sequence_values(k_w, v_w, omega, t.chunk, t.scale)
            needs_bias = bias is not None and ctx.needs_input_grad[3]
            if t.fused:
                if not ctx.consume:
                    q_w, k_w, v_w = (w.clone() if w is x else w for w, x in ((q_w, q), (k_w, k), (v_w, v)))
                dq, dk, dv, drk, d_beta, d_omega, d_bias = _fused_backward(
                    t, q_w, k_w, v_w, rk, beta, omega, weights, bias_w if needs_bias else None, bias_w, out_w, lse, do_w)
            else:
                dq, dk, dv, drk, d_beta, d_bias = attention_backward(t, q_w, k_w, v_w, rk, beta, bias_w, out_w, lse, do_w)
                d_omega = summaries.sequence_values_backward(k_w, v_w, omega, weights, d_beta, t.chunk, t.scale, dk, dv)
            param_grads = _chunk_keys_backward(chunk, drk, d_omega, t.chunk, dq, dk)
        grads = iter(param_grads)  # empty when no chunk is complete: the maps had no part in the output
        d_params = [next(grads, None) if needed else None for needed in ctx.needs_input_grad[8:]]
        like = (q, k, v, bias)
        return (*(g.detach().to(x.dtype) if g is not None else None for g, x in zip((dq, dk, dv, d_bias), like)),
                None, None, None, None, *d_params)


def _fused_backward(t: Tiling, q, k, v, rk, beta, omega, weights, bias_for_grad, bias, out, lse, d_out):
    """The fused kernel's backward (evalm/flash.py), which leaves dq, dk, dv in q, k, v; each
    completed range also gets its chunks' summary gradients and its blocks' T5-bias gradient."""
    c = t.chunk
    n = omega.shape[-2]
    drk, d_beta, d_omega = torch.zeros_like(rk), torch.zeros_like(beta), torch.zeros_like(omega)
    d_bias = torch.zeros(t.window, t.ext + t.window, dtype=bias.dtype) if bias_for_grad is not None else None

    def finish(r0: int, r1: int, dk_rows: Tensor, dv_rows: Tensor) -> None:
        """Rows r0 … r1−1 are complete: their chunks' d β is final, k and v still unchanged."""
        c0, c1 = r0 // c, min(n, r1 // c)
        if c1 > c0:
            rows = slice(c0 * c, c1 * c)
            local = slice(c0 * c - r0, c1 * c - r0)
            d_omega[..., c0:c1, :] = summaries.sequence_values_backward(
                k[:, rows], v[:, rows], omega[..., c0:c1, :], weights[..., c0:c1, :], d_beta[..., c0:c1, :], c, t.scale,
                dk_rows[:, local], dv_rows[:, local])
        if d_bias is not None:
            d_bias.add_(local_bias_grad(t, q, k, v, bias_for_grad, out, lse, d_out, r0 // t.window, r1 // t.window))

    parts = flash_dropout.parts(t, q, n) if t.dropout > 0 else flash.PARTS
    flash.backward(t, q, k, v, rk, beta, bias, out, lse, d_out, drk, d_beta, finish, parts)
    return q, k, v, drk, d_beta, d_omega, d_bias


def _chunk_keys_backward(chunk: ChunkKeys, d_k_tilde: Tensor, d_omega: Tensor, c: int, dq: Tensor, dk: Tensor) -> tuple:
    """Backpropagates d k̃, d ω through the adaptive maps: adds the chunk means' gradients into dq
    and dk (B, N, H, D) in place (each row of chunk r gets 1/c of d q̄_r), returns the maps' gradients."""
    if not chunk.leaves:
        return ()
    grads = torch.autograd.grad((chunk.k_tilde, chunk.omega), chunk.leaves, (d_k_tilde, d_omega))
    n = d_omega.shape[-2]
    for acc, mean_grad in zip((dq, dk), grads[:2]):
        acc[:, : n * c].unflatten(1, (n, c)).add_(mean_grad.to(acc.dtype).transpose(1, 2).unsqueeze(2), alpha=1 / c)
    return grads[2:]


def eva_attention(t: Tiling, q: Tensor, k: Tensor, v: Tensor, maps: AdaptiveMaps | None, bias: Tensor | None,
                  consume: bool = False) -> Tensor:
    """Causal EVA over a whole sequence: q, k, v (B, T, H, D) -> (B, T, H, D); the ⌊T/c⌋ chunk
    summaries come from `maps` (None: no remote entry at all, the block-local limit). `consume`:
    q, k, v are private to this call, so backward may overwrite them with their gradients.

    The (B, T, H, D) layout is the projections' own, so neither the inputs nor the output are
    copied into a head-major layout (out_proj reads the output as a view). `bias` is the
    (w, ext + w) T5 bias of one block (query row, key column), already scaled by s.
    """
    T = q.shape[1]
    n_chunks = T // t.chunk if maps is not None else 0
    params = maps.parameters() if maps is not None else []
    pad = -T % t.window  # right padding: a padded row is never a key of a real query
    if not pad:  # no slice: its backward would copy the output's gradient into a fresh tensor
        return EvaRecompute.apply(q, k, v, bias, t, maps, n_chunks, consume, *params)
    q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))  # fresh: private
    return EvaRecompute.apply(q, k, v, bias, t, maps, n_chunks, True, *params)[:, :T]
