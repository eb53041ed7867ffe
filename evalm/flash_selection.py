"""Selection on the fused path: a whole sequence with `select_chunks` (docs/eva.md, "Selection") on PyTorch's
fused CPU kernel, training included, as `flash_sweep.Parts`.

With selection the query at i reads three kinds of keys in one softmax: its window (EVA's local part, unchanged),
the summaries it may see less the k it chose (EVA's remote parts, each call now with the query's own mask, the
chosen summaries −inf; no remote part with `select_only`), and the c tokens of each chosen chunk (the selected
part). The first two run on the kernel as EVA's parts do. The selected part's keys differ per query, so it is
written out: k·c logits a query, its keys and values gathered from the sequence's own rows. Like any part it gives
an output and its ℓ, merged by log-sum-exp (flash.merge); its backward, from the joint output O and ℓ, is
FlashAttention's (Dao et al. 2022, Algorithm 2) written out, as the kernel does for the other parts:
    P = exp(s·q·k_j − ℓ),   dS = P ∘ (dO·v_j − rowsum(dO ∘ O)),   dq += s·dS·K,   dk_j = s·dS_j·q,   dv_j = P_j·dO,
with dk_j, dv_j added into the chunk tables below.

The chosen chunks' keys and values are read from two chunk tables, k and v laid out head-major a chunk a row
(B·H·C rows of c·D numbers, copied once a pass), so a query's k chunks are k contiguous rows; their gradients are
added into two tables of the same shape (`index_add_`, the same sums in the same order every run) and join the
rows' own gradients when backward's range of those rows completes (`add_token_grads`: a query's chunks lie before
its window, in ranges backward reaches later). A pass holds these two or four tables beside EVA's tensors. The
choice (`selection.choose`: the summaries' logits or Quest's bounds, no gradient) is made in forward and kept as
`picks` (B, N, H, k: chunk indices, −1 for none; 8 bytes a query, head and chunk), so backward reads the chunks
forward chose.

Legend: as evalm/flash.py; k the chunks chosen, R a group's rows, c tokens per chunk.
"""

from __future__ import annotations

import torch
from torch import Tensor

from evalm import flash, flash_sweep, selection
from evalm.flash import Local, Part, PartGrad, Remote
from evalm.heads import upcast
from evalm.operands import Operands, Outputs


class Selecting:
    """The parts of a call with selection and without dropout: EVA's local part, its remote parts less the chosen
    summaries, and the selected part. One instance a pass: forward fills `picks` group by group; backward reads
    them (`Outputs.picks`) and gathers the chosen tokens' gradients (`add_token_grads`)."""

    def __init__(self, x: Operands, y: Outputs | None = None):
        B, N, H, D = x.q.shape
        C, c = x.rk.shape[-2], x.t.chunk
        self.picks = y.picks if y is not None else x.q.new_full((B, N, H, x.t.select), -1, dtype=torch.long)
        self.backward_pass = y is not None
        self.bounds = None  # Quest's bounds of every whole chunk (B, H, 2C, D), forward with select_by "bound"
        if y is None and x.t.select_by == "bound":
            self.bounds = selection.key_bounds(upcast(x.k[:, : C * c]).transpose(1, 2), c)
        work = flash.accumulation_dtype(x.q)
        self.tables = tuple(_table(z, C, c).to(work) for z in (x.k, x.v))  # (B·H·C, c·D) each
        self.grads = tuple(torch.zeros_like(z) for z in self.tables) if y is not None else ()
        self.chunks = (C, c)
        self._chosen_group: Remote | None = None  # the group whose choice forward made last

    def forward(self, x: Operands) -> tuple[Tensor, Tensor]:
        """The joint output (B, N, H, D), in q's dtype, and ℓ (B, N, H); `picks` filled."""
        how = flash_sweep.Sweep(flash_sweep.ROWS, ranged=flash.accumulation_dtype(x.q) != x.q.dtype)
        out, lse = flash_sweep.sweep(x, self, how)
        return out.to(x.q.dtype), lse

    def local_forward(self, x: Operands, call: Local) -> tuple[Tensor, Tensor]:
        return flash_sweep.EXACT.local_forward(x, call)

    def local_backward(self, x: Operands, y: Outputs, call: Local) -> tuple[Tensor, Tensor, Tensor]:
        return flash_sweep.EXACT.local_backward(x, y, call)

    def remote_forward(self, x: Operands, part: Part, q_g: Tensor) -> tuple[Tensor, Tensor]:
        picks = self._picks(x, part.group, q_g)
        if part.selected:
            return _selected_forward(x, q_g, picks, self.tables)
        mask, seen = _mask(x, part, picks)
        o, lse = flash.remote_kernel(x, q_g, part.chunks, mask).forward(x.t.scale)
        return o, lse.masked_fill_(~seen, float("-inf"))  # the kernel says 0 for a row that sees no key

    def remote_backward(self, x: Operands, part: Part, q_g: Tensor, grad: PartGrad) -> tuple[Tensor, Tensor, Tensor]:
        picks = self._picks(x, part.group, q_g)
        if part.selected:
            d_q = self._selected_backward(x, q_g, grad, picks)
            none = x.rk.new_zeros(*x.rk.shape[:2], 0, x.rk.shape[-1])  # it reads no summary
            return d_q, none, none
        return flash.remote_kernel(x, q_g, part.chunks, _mask(x, part, picks)[0]).backward(x.t.scale, grad)

    def add_token_grads(self, r0: int, r1: int, dk_rows: Tensor, dv_rows: Tensor) -> None:
        """Rows r0 … r1−1 (r0 a multiple of c) are complete (`flash_sweep.Sink.finish`): every query that chose
        them has run, so their chunks' gathered gradients join the rows' own, dk_rows and dv_rows (B, r1 − r0, H, D)."""
        B, _, H, D = dk_rows.shape
        C, c = self.chunks
        c0, c1 = r0 // c, min(C, r1 // c)
        if c1 <= c0:
            return
        for rows, table in zip((dk_rows, dv_rows), self.grads):
            chunks = table.view(B, H, C, c, D)[:, :, c0:c1]  # (B, H, n, c, D) -> (B, n·c, H, D)
            rows[:, : (c1 - c0) * c].add_(chunks.permute(0, 2, 3, 1, 4).reshape(B, (c1 - c0) * c, H, D))

    def _picks(self, x: Operands, g: Remote, q_g: Tensor) -> Tensor:
        """The group's chosen chunks (B, H, R, k), −1 where a query chose fewer than k; in forward chosen here,
        once a group (its first part)."""
        if not self.backward_pass and g != self._chosen_group:
            self.picks[:, g.r0 : g.r1] = _choose(x, g, q_g, self.bounds).permute(0, 2, 1, 3)
            self._chosen_group = g
        return self.picks[:, g.r0 : g.r1].permute(0, 2, 1, 3)

    def _selected_backward(self, x: Operands, q_g: Tensor, grad: PartGrad, picks: Tensor) -> Tensor:
        """The selected part's dq (B, H, R, D); its keys' and values' gradients into the chunk tables' `grads`."""
        s = x.t.scale
        at, (keys, values), hidden = _gathered(x, picks, self.tables)
        q = q_g.to(keys.dtype)
        logits = _dots(keys, q).mul_(s).masked_fill_(hidden, float("-inf"))
        p = logits.sub_(grad.lse.to(keys.dtype).unsqueeze(-1)).exp_()  # the joint softmax's probabilities of these keys
        d_out = grad.d_out.to(keys.dtype)
        d_p = _dots(values, d_out)
        d_s = d_p.sub_((d_out * grad.out.to(keys.dtype)).sum(-1, keepdim=True)).mul_(p)
        d_q = (d_s.unsqueeze(-2) @ keys).squeeze(-2).mul_(s)
        row = self.tables[0].shape[-1]
        self.grads[0].index_add_(0, at, (d_s.unsqueeze(-1) * q.unsqueeze(-2)).mul_(s).reshape(-1, row))
        self.grads[1].index_add_(0, at, (p.unsqueeze(-1) * d_out.unsqueeze(-2)).reshape(-1, row))
        return d_q


def _table(z: Tensor, C: int, c: int) -> Tensor:
    """z (B, N, H, D) -> its whole chunks head-major, a chunk a row (B·H·C, c·D), one copy."""
    B, _, H, D = z.shape
    return z[:, : C * c].reshape(B, C, c, H, D).permute(0, 3, 1, 2, 4).reshape(B * H * C, c * D)


def _choose(x: Operands, g: Remote, q_g: Tensor, bounds: Tensor | None) -> Tensor:
    """The group's choice (B, H, R, k), −1 where fewer: among the chunks each query may select
    (`Tiling.candidate_count`), the top k by the summaries' logits or Quest's bound, as the tiles choose
    (evalm/tile_selection.py), in at least fp32."""
    t = x.t
    q = upcast(q_g) * t.scale
    if bounds is not None:
        scores = selection.bound_scores(q.unsqueeze(1), (bounds[..., : 2 * g.end, :],), g.end).squeeze(1)
    else:
        scores = q @ upcast(x.rk[..., : g.end, :]).transpose(-1, -2)
    pos = torch.arange(g.r0, g.r1, device=q.device)
    candidate = torch.arange(g.end, device=q.device) < t.candidate_count(pos).unsqueeze(-1)  # (R, end)
    _, index, valid = selection.choose(scores.masked_fill_(~candidate, float("-inf")).unsqueeze(1), t.select, t.select_group,
                                       mask=False)
    picks = q.new_full((*q.shape[:-1], t.select), -1, dtype=torch.long)
    picks[..., : index.shape[-1]] = torch.where(valid, index, -1).squeeze(1)  # fewer candidates than k
    return picks


def _mask(x: Operands, part: Part, picks: Tensor) -> tuple[Tensor, Tensor]:
    """A remote part's mask (B, H, R, chunks): its own (the tail's staircase, or none) with −inf at the chosen
    summaries, and which rows (B, H, R) still see one of its chunks."""
    a, b = part.chunks.start, part.chunks.stop
    B, H, R, _ = picks.shape
    work = flash.accumulation_dtype(x.q)
    mask = picks.new_zeros(B, H, R, b - a, dtype=work) if part.mask is None else part.mask.expand(B, H, -1, -1).clone()
    inside = (picks >= a) & (picks < b)
    at = inside.nonzero(as_tuple=True)
    mask[(*at[:3], picks[at] - a)] = float("-inf")
    visible = b - a if part.mask is None else (part.mask > float("-inf")).sum(-1)  # (R,) on the staircase
    return mask, inside.sum(-1) < visible


def _gathered(x: Operands, picks: Tensor, tables: tuple[Tensor, Tensor]) -> tuple[Tensor, tuple[Tensor, Tensor], Tensor]:
    """The chosen chunks' rows of the chunk tables (B·H·R·k), their keys and values (B, H, R, k·c, D) in at least
    fp32, and which are no choice (B, H, R, k·c)."""
    B, N, H, D = x.q.shape
    R, k, c = picks.shape[2], picks.shape[3], x.t.chunk
    C = tables[0].shape[0] // (B * H)
    base = (torch.arange(B * H, device=picks.device) * C).view(B, H, 1, 1)
    at = (base + picks.clamp(min=0)).flatten()
    rows = tuple(table.index_select(0, at).view(B, H, R, k * c, D) for table in tables)
    return at, rows, (picks < 0).repeat_interleave(c, -1)


def _dots(rows: Tensor, x: Tensor) -> Tensor:
    """Each query's vector against its own gathered rows: rows (B, H, R, J, D), x (B, H, R, D) -> (B, H, R, J).
    As an einsum: 3x faster on the CPU than the same batched matrix-vector product written with `@`."""
    return torch.einsum("bhrjd,bhrd->bhrj", rows, x)


def _selected_forward(x: Operands, q_g: Tensor, picks: Tensor, tables: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """The selected part: output (B, H, R, D) and ℓ (B, H, R), −inf (and output 0) where a query chose none."""
    _, (keys, values), hidden = _gathered(x, picks, tables)
    logits = _dots(keys, q_g.to(keys.dtype)).mul_(x.t.scale).masked_fill_(hidden, float("-inf"))
    lse = logits.logsumexp(-1)
    weights = logits.sub_(lse.masked_fill(lse == float("-inf"), 0.0).unsqueeze(-1)).exp_()
    return (weights.unsqueeze(-2) @ values).squeeze(-2), lse
