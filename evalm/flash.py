"""EVA's training attention on PyTorch's fused CPU attention kernel: softmax parts merged by
their log-sum-exp.

A query's joint softmax (docs/eva.md, "The closed form") runs over its local block keys and the chunk summaries
it may see. Cut the keys into parts and each part is plain masked attention, which PyTorch's
fused kernel (the FlashAttention recipe of Dao et al. 2022, in C++) computes with its own max
and sum. The parts combine exactly through their log-sum-exps ℓ_p:
    ℓ = log Σ_p exp ℓ_p,    o = Σ_p exp(ℓ_p − ℓ) · o_p.
Backward needs no combining: given the *joint* output and ℓ, the kernel's backward recomputes a
part's probabilities as exp(s − ℓ), which are the joint ones, and its dS = P ∘ (dP − rowsum(dO ∘ O))
is the joint softmax's gradient restricted to that part (FlashAttention, Algorithm 2).

The parts, none of which copies a key or a value:
  local   each block's w queries against its ext + w keys, one (w, ext + w) mask for every block
          (causality, T5 bias); all blocks in one call, laid on the kernel's batch axis;
  prefix  a group of ROWS queries against the chunks all of them see: no mask at all;
  tail    the same queries against the chunks that become visible inside the group: a small
          staircase mask (rows, rows/c).
So the work runs at the fused kernel's speed on views of q, k, v and the summaries, and the
forward keeps only the output and ℓ, as the plain-PyTorch path (evalm/recompute.py) does.

Attention dropout (the kernel refuses dropout_p > 0) is a −inf per dropped key in its mask, each
part run twice (evalm/flash_dropout.py). The plain path remains for non-CPU tensors (see
docs/model.md, "On a GPU"). The kernel returns no
gradient for its mask, so the T5 bias's gradient comes from recompute.local_bias_grad.
The two operators are the ones `F.scaled_dot_product_attention` dispatches to on the CPU; they
are called directly because the public function neither returns ℓ nor takes it in backward.

Legend:
  B sequences, N tokens (a multiple of w), H heads, D head dimension, C chunks, s = D^-1/2
  q, k, v, out, dO, dq, dk, dv   (B, N, H, D), the projections' own layout; the kernel takes
                                 (batch, H, rows, D), so calls read head-major views of them
  k̃ (rk), β (rv)                 (B, H, C, D) remote keys and values
  ℓ (lse)                        (B, N, H) log-sum-exp of each query's joint logits
  Local(seq, b0, b1)             one kernel call of the local part: blocks b0 … b1−1 (G = b1 − b0)
  Remote(r0, r1, prefix, end)    queries r0 … r1−1 (R rows) against chunks [0, prefix) (all
                                 visible) and [prefix, end) (a staircase)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from evalm.tiling import Tiling

# Rows per remote group in forward. From 768 query rows on, the kernel works in 256-row query
# blocks, which measured fastest (768 vs 256/512/1024 rows, benchmarks/attention.py shapes); a
# group computes about rows/(2c) masked tail logits per query, 3% of the logits at 8k tokens.
ROWS = 768
# Backward merges nothing, so its groups are free to differ: each call returns fresh (rows, D) and
# (chunks, D) gradients per head, so 256 rows and prefix calls of at most 256 chunks keep those
# transients small (2.7 MiB less peak at 8k tokens, time within noise).
BACKWARD_ROWS = 256
BACKWARD_CHUNKS = 256
# Backward writes each range's gradients over its rows of q, k, v once the range is complete; a
# range's buffers (dq, dk, dv rows and the kernel's fresh gradients) are its transient memory.
RANGE_ROWS = 1024

_FWD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_BWD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)


@functools.cache
def _kernel_works() -> bool:
    """Whether this torch has the two operators with the signatures used here (they are private:
    torch>=2.6,<2.15 has them; a later torch that changed them falls back to evalm/recompute.py)."""
    if _FWD is None or _BWD is None:
        return False
    x = torch.zeros(1, 1, 2, 4)
    mask = torch.zeros(2, 2)
    try:
        o, lse = _FWD(x, x, x, attn_mask=mask, scale=1.0)
        _BWD(x, x, x, x, o, lse, 0.0, False, attn_mask=mask, scale=1.0)
    except (RuntimeError, TypeError):
        return False
    return True


def accumulation_dtype(x: Tensor) -> torch.dtype:
    """fp32 for bf16/fp16 tensors (log-sum-exps, masks, merges and gradient sums), else x's dtype."""
    return torch.float32 if x.dtype in (torch.bfloat16, torch.float16) else x.dtype


def usable_on(x: Tensor) -> bool:
    """Whether the kernel works in this torch and takes x's device."""
    return x.device.type == "cpu" and _kernel_works()


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Softmax attention of q (B, H, L, D), already scaled, over k, v (B, H, S, D) with an additive
    (L, S) mask or none: output (B, H, L, D) and log-sum-exp (B, H, L). Every row must see a key."""
    return _FWD(q, k, v, attn_mask=mask, scale=1.0)


class Local(NamedTuple):
    """One kernel call of the local part: blocks b0 … b1−1 of one sequence, or of all (seq None)."""

    seq: int | None
    b0: int
    b1: int


def _local_calls(t: Tiling, batch: int, b0: int, b1: int, n_blocks: int) -> list[Local]:
    """Blocks b0 … b1−1 of sequences of n_blocks blocks in one call where their rows are one view
    (all blocks, or one sequence); with overlapping windows (ext = w), block 0 (no previous block)
    on its own, then the later blocks one sequence at a time (their windows are strided views of
    one sequence)."""
    if t.ext == 0:
        if batch == 1 or (b0 == 0 and b1 == n_blocks):
            return [Local(None, b0, b1)]
        return [Local(s, b0, b1) for s in range(batch)]
    first = [Local(None, 0, 1)] if b0 == 0 else []
    start = max(b0, 1)
    return first + ([Local(s, start, b1) for s in range(batch)] if start < b1 else [])


def _rows(x: Tensor, call: Local, w: int) -> Tensor:
    """The call's rows of x (B, N, H, ...) as (G, H, w, ...), a view (a copy would be an error)."""
    part = x[:, call.b0 * w : call.b1 * w] if call.seq is None else x[call.seq, call.b0 * w : call.b1 * w].unsqueeze(0)
    return part.view(-1, w, *x.shape[2:]).transpose(1, 2)


def _keys(x: Tensor, t: Tiling, call: Local) -> Tensor:
    """Local keys (or values) of the call's blocks, (G, H, ext + w, D): windows overlapping by ext
    rows, as one strided view of the contiguous x (B, N, H, D)."""
    if t.ext == 0 or call.b0 == 0:  # block 0 with overlap: its own w keys only
        return _rows(x, call, t.window)
    w, (_, _, H, D) = t.window, x.shape
    seq = x[call.seq]
    return seq.as_strided((call.b1 - call.b0, H, t.ext + w, D), (w * H * D, D, H * D, 1),
                          seq.storage_offset() + (call.b0 * w - t.ext) * H * D)


def _add_keys(acc: Tensor, grad: Tensor, t: Tiling, call: Local) -> None:
    """Add a call's local-key gradients (G, H, ext + w, D) into acc (B, N, H, D)."""
    w = t.window
    if t.ext == 0 or call.b0 == 0:
        _rows(acc, call, w).add_(grad)
        return
    _rows(acc, call._replace(b0=call.b0 - 1, b1=call.b1 - 1), w).add_(grad[..., : t.ext, :])  # ext = w: the previous block
    _rows(acc, call, w).add_(grad[..., t.ext :, :])


def _local_mask(t: Tiling, bias: Tensor | None, call: Local, like: Tensor) -> Tensor | None:
    """The (w, ext + w) additive mask of every block: T5 bias where visible, −inf after the query
    (None: the kernel's own causal mask). Block 0 with overlap keeps its last w columns."""
    if bias is None and t.ext == 0:
        return None
    mask = t.local_mask(bias, like.device, accumulation_dtype(like))
    return mask[:, t.ext :] if call.b0 == 0 else mask


def _local_forward(t: Tiling, call: Local, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor]:
    """The kernel on the call's blocks: output (G, H, w, D), laid out as (G, w, H, D), and ℓ (G, H, w).
    bf16 blocks run in fp32: the kernel's bf16 path is slower on w-row causal blocks (2x at w = 128)."""
    mask = _local_mask(t, bias, call, q)
    work = accumulation_dtype(q)
    return _FWD(_rows(q, call, t.window).to(work), _keys(k, t, call).to(work), _keys(v, t, call).to(work),
                is_causal=mask is None, attn_mask=mask, scale=t.scale)


def _local_backward(t: Tiling, call: Local, q, k, v, bias, out, lse, d_out) -> tuple[Tensor, Tensor, Tensor]:
    """The kernel's gradients for the call's blocks: dq (G, H, w, D), d keys and d values (G, H, ext + w, D),
    in fp32 for bf16 inputs (as `_local_forward`)."""
    mask = _local_mask(t, bias, call, q)
    w, work = t.window, accumulation_dtype(q)
    return _BWD(_rows(d_out, call, w).to(work), _rows(q, call, w).to(work), _keys(k, t, call).to(work),
                _keys(v, t, call).to(work), _rows(out, call, w).to(work), _rows(lse, call, w), 0.0, mask is None,
                attn_mask=mask, scale=t.scale)


class Remote(NamedTuple):
    """Queries r0 … r1−1, the chunks [0, prefix) all of them see, and [prefix, end) some of them."""

    r0: int
    r1: int
    prefix: int
    end: int


def _remote_groups(t: Tiling, start: int, stop: int, n_remote: int, rows: int) -> list[Remote]:
    """Groups of at most `rows` queries from start to stop that see some chunk."""
    out = []
    for r0 in range(start, stop, rows):
        r1 = min(stop, r0 + rows)
        end = min(n_remote, t.limit(r1 - 1))  # the group's last query sees most
        if end > 0:
            out.append(Remote(r0, r1, min(n_remote, t.limit(r0)), end))
    return out


def _parts(t: Tiling, g: Remote, like: Tensor, piece: int | None = None) -> list[tuple[slice, Tensor | None, Tensor | None]]:
    """(chunks, mask, rows that see any of them) of the group's prefix and tail calls; the prefix in
    calls of at most `piece` chunks (backward: each call returns gradients as wide as its chunks)."""
    piece = piece or max(1, g.prefix)
    parts = [(slice(a, min(g.prefix, a + piece)), None, None) for a in range(0, g.prefix, piece)]
    if g.end > g.prefix:
        pos = torch.arange(g.r0, g.r1, device=like.device)[:, None]
        visible = g.prefix + torch.arange(g.end - g.prefix, device=like.device) < t.limit(pos)
        mask = like.new_zeros(visible.shape, dtype=accumulation_dtype(like)).masked_fill_(~visible, float("-inf"))
        parts.append((slice(g.prefix, g.end), mask, visible.any(-1)))
    return parts


def _merge(acc_o: Tensor, acc_l: Tensor, o: Tensor, lse: Tensor) -> None:
    """Fold one part's output o (B, H, R, D) and ℓ (B, H, R) into acc_o (B, R, H, D), acc_l (B, R, H):
    ℓ' = log(e^ℓ_acc + e^ℓ_p), o' = e^(ℓ_acc − ℓ')·o_acc + e^(ℓ_p − ℓ')·o_p."""
    lse = lse.transpose(1, 2)
    total = torch.logaddexp(acc_l, lse)
    # nan_to_num: with dropout a row may keep no key of either side (ℓ = −inf on both), its output 0
    acc_o.mul_((acc_l - total).exp_().nan_to_num_(0.0).unsqueeze(-1))
    acc_o.add_(o.transpose(1, 2) * (lse - total).exp_().nan_to_num_(0.0).unsqueeze(-1))
    acc_l.copy_(total)


def forward(t: Tiling, q: Tensor, k: Tensor, v: Tensor, rk: Tensor, rv: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor]:
    """q, k, v (B, N, H, D) contiguous, N a multiple of w; k̃, β (B, H, C, D) -> out (B, N, H, D), ℓ (B, N, H)."""
    B, N, H, D = q.shape
    w = t.window
    work = accumulation_dtype(q)  # out: fp32 for bf16 q, so the merges accumulate in fp32
    low = work != q.dtype
    if low:  # in ranges, so the blocks' fp32 copies stay range-sized (`_local_forward`)
        calls = [call for r in _ranges(t, N // w)[::-1] for call in _local_calls(t, B, r.b0, r.b1, N // w)]
    else:
        calls = _local_calls(t, B, 0, N // w, N // w)
    if len(calls) == 1:  # the kernel's output is laid out as (B, N, H, D): it becomes `out`, no copy
        o, lse = _local_forward(t, calls[0], q, k, v, bias)
        out, lse = o.transpose(1, 2).reshape(B, N, H, D), lse.view(B, -1, H, w).transpose(2, 3).reshape(B, N, H)
    else:
        out, lse = q.new_empty(B, N, H, D, dtype=work), q.new_empty(B, N, H, dtype=work)
        for call in calls:
            o, part_lse = _local_forward(t, call, q, k, v, bias)
            _rows(out, call, w).copy_(o)
            _rows(lse, call, w).copy_(part_lse)
    rk, rv = rk.to(q.dtype), rv.to(q.dtype)  # the kernel takes one dtype; the summaries are small
    for g in _remote_groups(t, 0, N, rk.shape[-2], ROWS):
        q_g = q[:, g.r0 : g.r1].transpose(1, 2)  # the group's queries, head-major (B, H, R, D)
        for chunks, mask, seen in _parts(t, g, q):
            o, part_lse = _FWD(q_g, rk[..., chunks, :], rv[..., chunks, :], attn_mask=mask, scale=t.scale)
            if seen is not None:  # a row that sees none of the tail: the kernel reports ℓ = 0, not −inf
                part_lse.masked_fill_(~seen, float("-inf"))
            _merge(out[:, g.r0 : g.r1], lse[:, g.r0 : g.r1], o, part_lse)
    return out.to(q.dtype), lse  # bf16: one rounding of the fp32 merge


class Range(NamedTuple):
    """Blocks b0 … b1−1 of a backward pass: rows b0·w … b1·w − 1, written back when complete."""

    b0: int
    b1: int


def _ranges(t: Tiling, n_blocks: int) -> list[Range]:
    """Block ranges of about RANGE_ROWS rows, last first."""
    step = max(1, RANGE_ROWS // t.window)
    return [Range(b0, min(n_blocks, b0 + step)) for b0 in range(0, n_blocks, step)][::-1]


def _relative(call: Local, origin: int) -> Local:
    """The call with its blocks counted from block `origin` (a range buffer's first block)."""
    return call._replace(b0=call.b0 - origin, b1=call.b1 - origin)


def _local_range_backward(t: Tiling, r: Range, q, k, v, bias, out, lse, d_out, dq_r: Tensor, dk_r: Tensor, dv_r: Tensor,
                          parts: PartBackward) -> None:
    """The local part's gradients of the range's queries, added into range buffers: dq_r (B, R, H, D)
    for rows b0·w …, dk_r and dv_r (B, ext + R, H, D) for rows b0·w − ext … (the previous block's
    keys, with overlap)."""
    w, shift = t.window, t.ext // t.window
    for call in _local_calls(t, q.shape[0], r.b0, r.b1, q.shape[1] // w):
        d_q, d_k, d_v = parts.local(t, call, q, k, v, bias, out, lse, d_out)
        _rows(dq_r, _relative(call, r.b0), w).add_(d_q)
        own = _relative(call, r.b0 - shift)  # key rows of the call's own blocks in dk_r
        for acc, grad in ((dk_r, d_k), (dv_r, d_v)):
            if t.ext == 0 or call.b0 == 0:  # the keys are the blocks' own rows
                _rows(acc, own, w).add_(grad)
                continue
            _rows(acc, own._replace(b0=own.b0 - 1, b1=own.b1 - 1), w).add_(grad[..., : t.ext, :])
            _rows(acc, own, w).add_(grad[..., t.ext :, :])


def _remote_range_backward(t: Tiling, r: Range, q, rk, rv, out, lse, d_out, dq_r: Tensor, drk: Tensor, drv: Tensor,
                           parts: PartBackward) -> None:
    """The remote parts' gradients of the range's queries: into dq_r, and d k̃, d β (B, H, C, D);
    rk, rv and the accumulators in fp32 (or fp64)."""
    start = r.b0 * t.window
    for g in _remote_groups(t, start, r.b1 * t.window, rk.shape[-2], BACKWARD_ROWS):
        rows = slice(g.r0, g.r1)
        # the group's rows, head-major for the kernel: dO, q, O (B, H, R, D) and ℓ (B, H, R); in fp32
        # for bf16 inputs: the kernel's bf16 backward measured several times slower than its fp32 one
        d_out_g, q_g, out_g, lse_g = (x[:, rows].transpose(1, 2).to(accumulation_dtype(x)) for x in (d_out, q, out, lse))
        for chunks, mask, _ in _parts(t, g, q, piece=BACKWARD_CHUNKS):
            d_q, d_k_tilde, d_beta = parts.remote(t, g, chunks, mask, d_out_g, q_g, rk[..., chunks, :], rv[..., chunks, :],
                                                  out_g, lse_g)
            dq_r[:, g.r0 - start : g.r1 - start] += d_q.transpose(1, 2)
            drk[..., chunks, :] += d_k_tilde
            drv[..., chunks, :] += d_beta


def _remote_backward(t: Tiling, g: Remote, chunks: slice, mask: Tensor | None, d_out, q, k, v, out, lse) -> tuple[Tensor, Tensor, Tensor]:
    """The kernel's gradients of one remote part: dq (B, H, R, D), d k̃ and d β (B, H, chunks, D)."""
    return _BWD(d_out, q, k, v, out, lse, 0.0, False, attn_mask=mask, scale=t.scale)


class PartBackward(NamedTuple):
    """How backward differentiates one part: `_local_backward` and `_remote_backward` here, their
    attention-dropout versions in evalm/flash_dropout.py."""

    local: Callable  # (t, call, q, k, v, bias, out, lse, d_out) -> dq, d keys, d values
    remote: Callable  # (t, group, chunks, mask, dO, q, k̃, β, out, ℓ) of one part, head-major -> dq, d k̃, d β


PARTS = PartBackward(_local_backward, _remote_backward)


def backward(t: Tiling, q, k, v, rk, rv, bias, out, lse, d_out, drk: Tensor, drv: Tensor, finish,
             parts: PartBackward = PARTS) -> None:
    """Gradients of forward's output from the joint out and ℓ, written over q, k, v (B, N, H, D):
    afterwards they hold dq, dk, dv; d k̃ and d β are added into drk, drv (B, H, C, D).

    Ranges of blocks run last first. When a range is done, its rows' gradients are complete: no
    later (earlier-placed) query reads its keys, every query that sees its chunks has run, and
    `finish(r0, r1, dk_r, dv_r)` adds what the caller owes those rows (the chunk summaries'
    gradients, which need the chunks' final d β) while the original rows are still there. Then
    the range's gradients replace its rows of q, k, v, so backward holds three sequence-sized
    tensors fewer than a kernel call over the whole sequence would (its fresh dq, dk, dv).
    """
    B, N, H, D = q.shape
    w, ext = t.window, t.ext
    d_out = d_out.contiguous()
    carry = None  # with overlap: key gradients of the rows before the last range, (B, w, H, D)
    for r in _ranges(t, N // w):
        r0, r1 = r.b0 * w, r.b1 * w
        dq_r = torch.zeros(B, r1 - r0, H, D, dtype=accumulation_dtype(q))  # fp32 sums for bf16 gradients
        dk_r, dv_r = (torch.zeros(B, ext + r1 - r0, H, D, dtype=dq_r.dtype) for _ in range(2))
        if carry is not None:
            dk_r[:, -w:] += carry[0]
            dv_r[:, -w:] += carry[1]
        _local_range_backward(t, r, q, k, v, bias, out, lse, d_out, dq_r, dk_r, dv_r, parts)
        _remote_range_backward(t, r, q, rk, rv, out, lse, d_out, dq_r, drk, drv, parts)
        carry = (dk_r[:, :ext], dv_r[:, :ext]) if ext else None
        finish(r0, r1, dk_r[:, ext:], dv_r[:, ext:])
        q[:, r0:r1] = dq_r
        k[:, r0:r1] = dk_r[:, ext:]
        v[:, r0:r1] = dv_r[:, ext:]
