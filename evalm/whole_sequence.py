"""EVA over a whole sequence as one `torch.autograd.Function`: the paths "fused" and "recompute".

Training and one-shot scoring take it (evalm/eva_paths.py decides which, once per call, and the
caller hands this module the implementation of that path: `FUSED` or `PLAIN`). The forward keeps
q, k, v, the output and each query's log-sum-exp, nothing chunk-sized; the backward recomputes
the chunk state (k̃, ω, β, evalm/summaries.py), then the attention's gradients with the path's
implementation (PyTorch's fused CPU kernel, evalm/flash.py, or plain PyTorch ops,
evalm/recompute.py), then differentiates k̃ and ω through the adaptive maps. Low-precision inputs
run in fp32 inside (bf16 stays bf16 on the fused path); autocast is kept out.

Pinned by tests/evalm/test_recompute.py (output and every gradient against the autograd path and
the per-token oracle, float64, both paths; gradcheck with dropout and noise) and
tests/evalm/test_oracles_long.py (n = 2,003).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from evalm import flash, flash_dropout, flash_selection, flash_sweep, summaries
from evalm.heads import upcast  # softmax work in at least fp32: exp of bf16 logits loses the small weights
from evalm.operands import Gradients, Operands, Outputs
from evalm.recompute import attention_backward, attention_forward, local_bias_grad
from evalm.summaries import AdaptiveMaps, ChunkRows, ChunkValues
from evalm.tiling import Tiling


class Implementation(Protocol):
    """How one whole-sequence path computes the joint attention and its gradients."""

    native_bf16: bool  # bf16 q, k, v go to it as they are (else upcast to fp32)
    writes_over_inputs: bool  # backward leaves dq, dk, dv in the operands' q, k, v

    def forward(self, x: Operands) -> tuple[Tensor, Tensor, Tensor | None]:
        """out (B, N, H, D), each query's log-sum-exp and, with selection, the chunks it chose (`Outputs.picks`)."""
        ...

    def backward(self, x: Operands, y: Outputs, chunks: ChunkValues, bias_grad: bool) -> Gradients:
        """Every gradient (d ω included; d bias where `bias_grad`)."""
        ...


class Fused:
    """Path "fused": PyTorch's fused CPU kernel in parts (evalm/flash_sweep.py), with or without
    attention dropout (evalm/flash_dropout.py), or with selection (evalm/flash_selection.py)."""

    native_bf16 = True  # the kernel takes bf16; merges and gradient sums are fp32 (evalm/flash.py)
    writes_over_inputs = True

    def forward(self, x: Operands) -> tuple[Tensor, Tensor, Tensor | None]:
        if x.t.select:
            parts = flash_selection.Selecting(x)
            return (*parts.forward(x), parts.picks)
        return (*flash_dropout.parts(x).forward(x), None)

    def backward(self, x: Operands, y: Outputs, chunks: ChunkValues, bias_grad: bool) -> Gradients:
        """`flash_sweep.backward`, which leaves dq, dk, dv in x.q, x.k, x.v; each completed range
        also gets its chosen tokens' gradients (with selection), its chunks' summary gradients and its
        blocks' T5-bias gradient."""
        t = x.t
        c, n = t.chunk, chunks.omega.shape[-2]
        drk, d_beta, d_omega = torch.zeros_like(x.rk), torch.zeros_like(chunks.beta), torch.zeros_like(chunks.omega)
        d_bias = torch.zeros(t.window, t.ext + t.window, dtype=x.bias.dtype) if bias_grad else None
        parts = flash_selection.Selecting(x, y) if t.select else flash_dropout.parts(x)

        def finish(r0: int, r1: int, dk_rows: Tensor, dv_rows: Tensor) -> None:
            """Rows r0 … r1−1 are complete: their chunks' d β is final, k and v still unchanged."""
            if t.select:
                parts.add_token_grads(r0, r1, dk_rows, dv_rows)
            c0, c1 = r0 // c, min(n, r1 // c)
            if c1 > c0:
                rows, local = slice(c0 * c, c1 * c), slice(c0 * c - r0, c1 * c - r0)
                d_omega[..., c0:c1, :] = summaries.sequence_values_backward(
                    ChunkRows(x.k[:, rows], x.v[:, rows], c, t.scale), chunks.chunks(c0, c1), d_beta[..., c0:c1, :],
                    dk_rows[:, local], dv_rows[:, local])
            if d_bias is not None:
                d_bias.add_(local_bias_grad(x, y, r0 // t.window, r1 // t.window))

        flash_sweep.backward(x, y, parts, flash_sweep.Sink(drk, d_beta, finish))
        return Gradients(x.q, x.k, x.v, drk, d_beta, d_omega, d_bias)


class Plain:
    """Path "recompute": the same arithmetic in plain PyTorch ops (evalm/recompute.py), any device."""

    native_bf16 = False
    writes_over_inputs = False

    def forward(self, x: Operands) -> tuple[Tensor, Tensor, None]:
        return (*attention_forward(x), None)  # selection never takes this path (evalm/eva_paths.py)

    def backward(self, x: Operands, y: Outputs, chunks: ChunkValues, bias_grad: bool) -> Gradients:
        grads = attention_backward(x, y)
        rows = ChunkRows(x.k, x.v, x.t.chunk, x.t.scale)
        d_omega = summaries.sequence_values_backward(rows, chunks, grads.d_beta, grads.dk, grads.dv)
        return grads._replace(d_omega=d_omega, d_bias=grads.d_bias if bias_grad else None)


FUSED, PLAIN = Fused(), Plain()


@dataclass(frozen=True)
class WholeSequence:
    """How one whole-sequence call runs: its tiling (the rule, dropout and noise seeds), the path's
    implementation, and the adaptive maps of the chunk summaries (None: no remote entry at all, the
    block-local limit). `consume`: q, k, v are private to this call (the caller's own projections,
    used by nothing else), so a backward that writes over its inputs may write over them."""

    t: Tiling
    implementation: Implementation = FUSED
    maps: AdaptiveMaps | None = None
    consume: bool = False


class Needs(NamedTuple):
    """`ctx.needs_input_grad` of `EvaRecompute`, by name: its inputs are (q, k, v, bias, call,
    n_chunks, *map_params), in this order."""

    q: bool
    k: bool
    v: bool
    bias: bool
    params: tuple[bool, ...]  # the maps' parameters, A_q's then A_k's (`AdaptiveMaps.parameters`)

    @classmethod
    def of(cls, flags: tuple[bool, ...]) -> Needs:
        q, k, v, bias, _call, _n_chunks, *params = flags
        return cls(q, k, v, bias, tuple(params))


class ChunkKeys(NamedTuple):
    """k̃ and ω (B, H, n, D) with, in backward, the leaves autograd differentiates them by."""

    k_tilde: Tensor
    omega: Tensor
    leaves: tuple[Tensor, ...]  # the chunk means q̄, k̄ and the maps' parameters that need a gradient

    @classmethod
    def of(cls, call: WholeSequence, n: int, q: Tensor, k: Tensor, params: list[Tensor] | None = None) -> ChunkKeys:
        """Computed from q, k (B, N, H, D), returned in their dtype; differentiable by the chunk
        means and `params` when these are given (backward, under `torch.enable_grad`)."""
        B, _, H, D = q.shape
        if call.maps is None or n == 0:
            empty = q.new_zeros(B, H, 0, D)
            return cls(empty, empty, ())
        dtype = call.maps.parameters()[0].dtype
        means = [summaries.chunk_means(x, n, call.t.chunk, dtype) for x in (q, k)]
        if params is not None:
            means = [m.detach().requires_grad_() for m in means]
        q_mean, k_mean = means
        k_tilde, omega = summaries.keys(call.maps, q_mean, k_mean, call.t.noise_seed)
        work = flash.accumulation_dtype(q)  # bf16 q: the chunk state in fp32
        return cls(k_tilde.to(work), omega.to(work), (q_mean, k_mean, *params) if params is not None else ())


def _work(call: WholeSequence, like: Tensor, x: Tensor) -> Tensor:
    """x as the implementation takes it, contiguous: bf16 as given where it takes bf16 (decided by
    `like`, the queries), else in at least fp32 (the plain path's own softmax arithmetic)."""
    native = call.implementation.native_bf16 and like.dtype == torch.bfloat16
    return (x if native else upcast(x)).contiguous()


def _operands(call: WholeSequence, n: int, tensors: tuple[Tensor, Tensor, Tensor, Tensor | None],
              params: list[Tensor] | None = None) -> tuple[Operands, ChunkKeys, ChunkValues]:
    """The call's operands in the implementation's dtype, with the chunk state recomputed from q
    and k (differentiable by `params` in backward). The T5 bias is a mask: at least fp32."""
    q, k, v, bias = tensors
    q_w, k_w, v_w = (_work(call, q, x) for x in (q, k, v))
    with torch.enable_grad() if params is not None else torch.no_grad():
        chunk = ChunkKeys.of(call, n, q_w, k_w, params)
    state = summaries.sequence_values(ChunkRows(k_w, v_w, call.t.chunk, call.t.scale), chunk.omega.detach())
    x = Operands(call.t, q_w, k_w, v_w, chunk.k_tilde.detach(), state.beta, upcast(bias) if bias is not None else None)
    return x, chunk, state


class EvaRecompute(torch.autograd.Function):
    """EVA attention that keeps neither its logits nor its chunk state: the backward recomputes
    k̃, ω and β from q and k (O(n·D) work), then the logits group by group, with the call's
    implementation (`WholeSequence.implementation`).

    β's gradient is added in place into dk and dv, and k̃ and ω are differentiated through the
    adaptive maps by a small autograd graph built in backward, so no sequence-sized product
    (k·ω, ‖k‖², weights·v or their gradients) and no chunk state outlives its use. An
    implementation that writes its gradients over q, k, v gets copies unless the call `consume`s them."""

    @staticmethod
    def forward(ctx, q, k, v, bias, call: WholeSequence, n_chunks: int, *map_params):
        with torch.autocast(q.device.type, enabled=False):  # else bf16 autocast recasts every matmul
            x, _, _ = _operands(call, n_chunks, (q, k, v, bias))
            out, lse, picks = call.implementation.forward(x)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, bias, out, lse, picks)
        ctx.call, ctx.n_chunks = call, n_chunks
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, bias, out, lse, picks = ctx.saved_tensors
        call, needs = ctx.call, Needs.of(ctx.needs_input_grad)
        params = [p for p, needed in zip(call.maps.parameters() if call.maps else (), needs.params) if needed]
        with torch.autocast(q.device.type, enabled=False):
            x, chunk, state = _operands(call, ctx.n_chunks, (q, k, v, bias), params)
            if call.implementation.writes_over_inputs and not call.consume:
                x = dataclasses.replace(x, **{name: w.clone() if w is given else w
                                              for name, w, given in (("q", x.q, q), ("k", x.k, k), ("v", x.v, v))})
            y = Outputs(_work(call, q, out), lse, _work(call, q, d_out), picks)
            grads = call.implementation.backward(x, y, state, bias is not None and needs.bias)
            param_grads = _chunk_keys_backward(chunk, grads, call.t.chunk)
        given = iter(param_grads)  # empty when no chunk is complete: the maps had no part in the output
        d_params = [next(given, None) if needed else None for needed in needs.params]
        like = (q, k, v, bias)
        return (*(g.detach().to(z.dtype) if g is not None else None for g, z in zip(grads[:3] + (grads.d_bias,), like)),
                None, None, *d_params)


def _chunk_keys_backward(chunk: ChunkKeys, grads: Gradients, c: int) -> tuple:
    """Backpropagates d k̃, d ω through the adaptive maps: adds the chunk means' gradients into dq
    and dk (B, N, H, D) in place (each row of chunk r gets 1/c of d q̄_r), returns the maps' gradients."""
    if not chunk.leaves:
        return ()
    mean_grads = torch.autograd.grad((chunk.k_tilde, chunk.omega), chunk.leaves, (grads.drk, grads.d_omega))
    n = grads.d_omega.shape[-2]
    for acc, mean_grad in zip((grads.dq, grads.dk), mean_grads[:2]):
        acc[:, : n * c].unflatten(1, (n, c)).add_(mean_grad.to(acc.dtype).transpose(1, 2).unsqueeze(2), alpha=1 / c)
    return mean_grads[2:]


def eva_attention(call: WholeSequence, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    """Causal EVA over a whole sequence: q, k, v (B, T, H, D) -> (B, T, H, D); the ⌊T/c⌋ chunk
    summaries come from `call.maps`.

    The (B, T, H, D) layout is the projections' own, so neither the inputs nor the output are
    copied into a head-major layout (out_proj reads the output as a view). `bias` is the
    (w, ext + w) T5 bias of one block (query row, key column), already scaled by s.
    """
    T = q.shape[1]
    n_chunks = T // call.t.chunk if call.maps is not None else 0
    params = call.maps.parameters() if call.maps is not None else []
    pad = -T % call.t.window  # right padding: a padded row is never a key of a real query
    if not pad:  # no slice: its backward would copy the output's gradient into a fresh tensor
        return EvaRecompute.apply(q, k, v, bias, call, n_chunks, *params)
    q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))  # fresh: private
    call = dataclasses.replace(call, consume=True)
    return EvaRecompute.apply(q, k, v, bias, call, n_chunks, *params)[:, :T]
