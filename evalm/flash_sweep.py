"""The passes of the fused path over EVA's parts (evalm/flash.py): a forward `sweep` and the
`backward`, for any `Parts`, the interface of how one part runs on the kernel: `EXACT` here (one
kernel call per part) or attention dropout's `flash_dropout.Dropped` (each part twice, a −inf per
dropped key). The walks are written once; the two differ only in their kernel calls.

Legend: as evalm/flash.py; x, y the call's `Operands` and backward's `Outputs` (evalm/operands.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple, Protocol

import torch
from torch import Tensor

from evalm import flash
from evalm.flash import Local, Part, PartGrad
from evalm.operands import Operands, Outputs
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


class Parts(Protocol):
    """How the kernel runs each part: `EXACT` below, or attention dropout's `flash_dropout.Dropped`.
    `sweep` and `backward` below walk the parts and call these."""

    def forward(self, x: Operands) -> tuple[Tensor, Tensor]:
        """The joint output (B, N, H, D), in q's dtype, and ℓ (B, N, H)."""
        ...

    def local_forward(self, x: Operands, call: Local) -> tuple[Tensor, Tensor]:
        """A local call's output (G, H, w, D) and ℓ (G, H, w)."""
        ...

    def remote_forward(self, x: Operands, part: Part, q_g: Tensor) -> tuple[Tensor, Tensor]:
        """A remote part's output (B, H, R, D) and ℓ (B, H, R), −inf on a row that sees no key."""
        ...

    def local_backward(self, x: Operands, y: Outputs, call: Local) -> tuple[Tensor, Tensor, Tensor]:
        """dq (G, H, w, D), d keys and d values (G, H, ext + w, D) of a local call."""
        ...

    def remote_backward(self, x: Operands, part: Part, q_g: Tensor, grad: PartGrad) -> tuple[Tensor, Tensor, Tensor]:
        """dq (B, H, R, D), d k̃ and d β (B, H, chunks, D) of a remote part."""
        ...


class Sweep(NamedTuple):
    """How a forward pass walks the parts: remote groups of `rows` queries, prefix calls of at most
    `piece` chunks (None: one call), local calls a range at a time (`ranged`: their transients stay
    range-sized) or all at once; `outputs` False keeps ℓ alone (the outputs are not merged)."""

    rows: int
    piece: int | None = None
    ranged: bool = False
    outputs: bool = True


def _local_sweep(x: Operands, parts: Parts, how: Sweep) -> tuple[Tensor | None, Tensor]:
    """The local part of `sweep`: every block's output and ℓ (B, N, H, ...), each written once."""
    B, N, H, D = x.q.shape
    w, n_blocks = x.t.window, N // x.t.window
    if how.ranged:
        calls = [call for r in ranges(x.t, n_blocks)[::-1] for call in flash.local_calls(x.t, B, r.b0, r.b1, n_blocks)]
    else:
        calls = flash.local_calls(x.t, B, 0, n_blocks, n_blocks)
    if len(calls) == 1 and how.outputs:  # the kernel's output is laid out as (B, N, H, D): it becomes `out`, no copy
        o, lse = parts.local_forward(x, calls[0])
        return o.transpose(1, 2).reshape(B, N, H, D), lse.view(B, -1, H, w).transpose(2, 3).reshape(B, N, H)
    work = flash.accumulation_dtype(x.q)
    out = x.q.new_empty(B, N, H, D, dtype=work) if how.outputs else None
    lse = x.q.new_empty(B, N, H, dtype=work)
    for call in calls:
        o, part_lse = parts.local_forward(x, call)
        if out is not None:
            flash.block_rows(out, call, w).copy_(o)
        flash.block_rows(lse, call, w).copy_(part_lse)
    return out, lse


def sweep(x: Operands, parts: Parts, how: Sweep) -> tuple[Tensor | None, Tensor]:
    """One forward pass over every part: the merged output (B, N, H, D) and ℓ (B, N, H), in fp32 for
    bf16 q (the merges accumulate in fp32); the output None without `how.outputs`."""
    out, lse = _local_sweep(x, parts, how)
    x = dataclasses.replace(x, rk=x.rk.to(x.q.dtype), rv=x.rv.to(x.q.dtype))  # the kernel takes one dtype
    for g in flash.remote_groups(x.t, 0, x.q.shape[1], x.rk.shape[-2], how.rows):
        q_g = x.q[:, g.r0 : g.r1].transpose(1, 2)  # the group's queries, head-major (B, H, R, D)
        for part in flash.remote_parts(x.t, g, x.q, how.piece):
            o, part_lse = parts.remote_forward(x, part, q_g)
            flash.merge(out[:, g.r0 : g.r1] if out is not None else None, lse[:, g.r0 : g.r1], o, part_lse)
    return out, lse


class Exact:
    """The parts without dropout: one kernel call each."""

    def forward(self, x: Operands) -> tuple[Tensor, Tensor]:
        """q, k, v (B, N, H, D) contiguous, N a multiple of w -> out (B, N, H, D), ℓ (B, N, H). bf16 q:
        the local blocks in ranges, so their fp32 copies stay range-sized (`local_kernel`)."""
        out, lse = sweep(x, self, Sweep(ROWS, ranged=flash.accumulation_dtype(x.q) != x.q.dtype))
        return out.to(x.q.dtype), lse  # bf16: one rounding of the fp32 merge

    def local_forward(self, x: Operands, call: Local) -> tuple[Tensor, Tensor]:
        return flash.local_kernel(x, call, flash.local_mask(x, call)).forward(x.t.scale)

    def remote_forward(self, x: Operands, part: Part, q_g: Tensor) -> tuple[Tensor, Tensor]:
        o, lse = flash.remote_kernel(x, q_g, part.chunks, part.mask).forward(x.t.scale)
        if part.seen is not None:  # a row that sees none of the tail: the kernel reports ℓ = 0, not −inf
            lse.masked_fill_(~part.seen, float("-inf"))
        return o, lse

    def local_backward(self, x: Operands, y: Outputs, call: Local) -> tuple[Tensor, Tensor, Tensor]:
        return flash.local_kernel(x, call, flash.local_mask(x, call)).backward(x.t.scale, flash.local_grad(x, y, call))

    def remote_backward(self, x: Operands, part: Part, q_g: Tensor, grad: PartGrad) -> tuple[Tensor, Tensor, Tensor]:
        return flash.remote_kernel(x, q_g, part.chunks, part.mask).backward(x.t.scale, grad)


EXACT = Exact()


# ------------------------------------------------------------------------------------ the backward

class Range(NamedTuple):
    """Blocks b0 … b1−1 of a backward pass: rows b0·w … b1·w − 1, written back when complete."""

    b0: int
    b1: int


def ranges(t: Tiling, n_blocks: int) -> list[Range]:
    """Block ranges of about RANGE_ROWS rows, last first."""
    step = max(1, RANGE_ROWS // t.window)
    return [Range(b0, min(n_blocks, b0 + step)) for b0 in range(0, n_blocks, step)][::-1]


class Sink(NamedTuple):
    """Where `backward` puts what is not a gradient of q, k, v: d k̃ and d β added into drk, drv
    (B, H, C, D), and `finish(r0, r1, dk_rows, dv_rows)`, called when rows r0 … r1−1 are complete."""

    drk: Tensor
    drv: Tensor
    finish: Callable[[int, int, Tensor, Tensor], None]


class RangeGrads(NamedTuple):
    """A range's gradient buffers: dq (B, R, H, D) for rows b0·w …, dk and dv (B, ext + R, H, D) for
    rows b0·w − ext … (the previous block's keys, with overlap)."""

    dq: Tensor
    dk: Tensor
    dv: Tensor


def _relative(call: Local, origin: int) -> Local:
    """The call with its blocks counted from block `origin` (a range buffer's first block)."""
    return call._replace(b0=call.b0 - origin, b1=call.b1 - origin)


def _local_range_backward(x: Operands, y: Outputs, parts: Parts, r: Range, acc: RangeGrads) -> None:
    """The local part's gradients of the range's queries, added into its buffers."""
    t = x.t
    w, shift = t.window, t.ext // t.window
    for call in flash.local_calls(t, x.q.shape[0], r.b0, r.b1, x.q.shape[1] // w):
        d_q, d_k, d_v = parts.local_backward(x, y, call)
        flash.block_rows(acc.dq, _relative(call, r.b0), w).add_(d_q)
        own = _relative(call, r.b0 - shift)  # key rows of the call's own blocks in acc.dk
        for into, grad in ((acc.dk, d_k), (acc.dv, d_v)):
            if t.ext == 0 or call.b0 == 0:  # the keys are the blocks' own rows
                flash.block_rows(into, own, w).add_(grad)
                continue
            flash.block_rows(into, own._replace(b0=own.b0 - 1, b1=own.b1 - 1), w).add_(grad[..., : t.ext, :])
            flash.block_rows(into, own, w).add_(grad[..., t.ext :, :])


def _remote_range_backward(x: Operands, y: Outputs, parts: Parts, r: Range, dq_r: Tensor, sink: Sink) -> None:
    """The remote parts' gradients of the range's queries: into dq_r, and d k̃, d β into the sink;
    x.rk, x.rv and the sink in fp32 (or fp64)."""
    start = r.b0 * x.t.window
    for g in flash.remote_groups(x.t, start, r.b1 * x.t.window, x.rk.shape[-2], BACKWARD_ROWS):
        rows = slice(g.r0, g.r1)
        # the group's rows, head-major for the kernel: dO, q, O (B, H, R, D) and ℓ (B, H, R); in fp32
        # for bf16 inputs: the kernel's bf16 backward measured several times slower than its fp32 one
        d_out_g, q_g, out_g, lse_g = (z[:, rows].transpose(1, 2).to(flash.accumulation_dtype(z)) for z in (y.d_out, x.q, y.out, y.lse))
        grad = PartGrad(d_out_g, out_g, lse_g)
        for part in flash.remote_parts(x.t, g, x.q, BACKWARD_CHUNKS):
            d_q, d_k_tilde, d_beta = parts.remote_backward(x, part, q_g, grad)
            dq_r[:, g.r0 - start : g.r1 - start] += d_q.transpose(1, 2)
            sink.drk[..., part.chunks, :] += d_k_tilde
            sink.drv[..., part.chunks, :] += d_beta


def backward(x: Operands, y: Outputs, parts: Parts, sink: Sink) -> None:
    """Gradients of the parts' forward from the joint out and ℓ, written over x.q, x.k, x.v
    (B, N, H, D): afterwards they hold dq, dk, dv; d k̃ and d β go into the sink.

    Ranges of blocks run last first. When a range is done, its rows' gradients are complete: no
    later (earlier-placed) query reads its keys, every query that sees its chunks has run, and
    `sink.finish` adds what the caller owes those rows (the chunk summaries' gradients, which need
    the chunks' final d β) while the original rows are still there. Then the range's gradients
    replace its rows of q, k, v, so backward holds three sequence-sized tensors fewer than a
    kernel call over the whole sequence would (its fresh dq, dk, dv).
    """
    B, N, H, D = x.q.shape
    w, ext = x.t.window, x.t.ext
    y = dataclasses.replace(y, d_out=y.d_out.contiguous())
    carry = None  # with overlap: key gradients of the rows before the last range, (B, w, H, D)
    for r in ranges(x.t, N // w):
        r0, r1 = r.b0 * w, r.b1 * w
        dq_r = torch.zeros(B, r1 - r0, H, D, dtype=flash.accumulation_dtype(x.q))  # fp32 sums for bf16 gradients
        acc = RangeGrads(dq_r, *(torch.zeros(B, ext + r1 - r0, H, D, dtype=dq_r.dtype) for _ in range(2)))
        if carry is not None:
            acc.dk[:, -w:] += carry[0]
            acc.dv[:, -w:] += carry[1]
        _local_range_backward(x, y, parts, r, acc)
        _remote_range_backward(x, y, parts, r, acc.dq, sink)
        carry = (acc.dk[:, :ext], acc.dv[:, :ext]) if ext else None
        sink.finish(r0, r1, acc.dk[:, ext:], acc.dv[:, ext:])
        x.q[:, r0:r1] = acc.dq
        x.k[:, r0:r1] = acc.dk[:, ext:]
        x.v[:, r0:r1] = acc.dv[:, ext:]
