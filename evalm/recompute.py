"""EVA's whole-sequence attention in linear memory: the FlashAttention recipe on EVA's block tiling.

The forward keeps only q, k, v, the output and each query's log-sum-exp (all O(n·D)); the
backward recomputes the chunk summaries (k̃, ω, β: evalm/summaries.py) and every tile's logits
from them (Dao et al. 2022, FlashAttention, Algorithm 2). Autograd's graph of the same
computation would keep every tile's probabilities, O(n·(w + n/c)) per head; keeping the chunk
state would cost about 1.1·n·E values per layer, which exact attention does not have.

Two implementations of the same arithmetic, chosen by evalm/eva_paths.py: PyTorch's fused CPU
kernel (evalm/flash.py, path "fused") and the plain PyTorch ops below (path "recompute"), which
also serve attention dropout and non-CPU tensors. Both are pinned by tests/evalm/test_recompute.py
(autograd path and per-token oracle, float64, every gradient) and test_oracles_long.py (n = 2,003).

Legend (plain-PyTorch path):
  B sequences, N tokens (a multiple of w), H heads, D head dimension, C chunks, s = D^-1/2
  q, k, v, out, dO   (B, N, H, D), the projections' own layout; k_pad, v_pad with ext zero rows in front
  k̃ (rk), β (rv)     (B, H, C, D) remote keys and values
  lse                (B, H, N) log-sum-exp of each query's joint logits
  a group            blocks b0 … b1−1 (or rows r0 … r1−1 of one block) and the n_vis chunks its last
                     query sees; `loc` (B, H, G, rows, ext + w) and `rem` (B, H, G·rows, n_vis) its
                     local and remote logits, then probabilities P
  D_i = dO_i·O_i     Σ_j P_ij dP_ij, the softmax backward's row term (FlashAttention's D)

Layout. Queries are cut into blocks of w rows; block b's local keys are the ext + w positions
b·w − ext … b·w + w − 1, so one masked (w, ext + w) logit matrix per block holds causality, the
window and the T5 bias (the same for every block: it depends on i − j only). A group's queries
share one read of the remote entries they can see, and a staircase mask keeps each query on the
chunks r < `Tiling.limit(i)`. Local and remote logits share one softmax: one max, one sum.

Attention dropout acts on the joint probabilities, as in the reference. Its keep masks are a pure
function of (seed, sequence, head, query, key) (evalm/dropout_mask.py), the seed drawn at forward
time, so the backward regenerates exactly the masks the forward used, and the fused path draws
the same ones. Low-precision inputs run in fp32.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from evalm import dropout_mask
from evalm.heads import upcast  # softmax work in at least fp32: exp of bf16 logits loses the small weights
from evalm.operands import Gradients, Operands, Outputs
from evalm.tiling import Tiling


class Group(NamedTuple):
    """Blocks b0 … b1−1, rows r0 … r1−1 of each (all w rows, or a piece of one block), n_vis chunks."""

    b0: int
    b1: int
    r0: int
    r1: int
    n_vis: int

    def rows(self, w: int) -> slice:
        """The group's query positions."""
        return slice(self.b0 * w + self.r0, (self.b1 - 1) * w + self.r1)


MIN_PIECE = 32  # rows: a thinner piece of a block costs more in per-call overhead than it saves


def _visible_chunks(t: Tiling, n_remote: int, last: int) -> int:
    """Chunks a group sees: those its last query `last` sees (it sees the most)."""
    return min(n_remote, t.limit(last))


def _group_cost(t: Tiling, batch_heads: int, n_remote: int, rows: int, last: int) -> int:
    """Logits of a group of `rows` queries ending at `last`."""
    return batch_heads * rows * (t.ext + t.window + _visible_chunks(t, n_remote, last))


def groups(t: Tiling, batch_heads: int, n_blocks: int, n_remote: int) -> list[Group]:
    """The groups of a sequence, as large as the logit budget allows. A block whose own logits
    exceed it (its queries see many chunks) is cut into pieces of rows: the working set stays in
    cache and backward's transient (B, H, rows, n_vis) tensors stay small."""
    w, out, b0 = t.window, [], 0
    while b0 < n_blocks:
        block_end = b0 * w + w - 1
        if _group_cost(t, batch_heads, n_remote, w, block_end) > t.group_logits:
            step = max(MIN_PIECE, t.group_logits // _group_cost(t, batch_heads, n_remote, 1, block_end))
            step = -(-w // -(-w // step))  # equal pieces: 120 rows would leave a thin 8-row piece
            for r0 in range(0, w, step):
                r1 = min(w, r0 + step)
                out.append(Group(b0, b0 + 1, r0, r1, _visible_chunks(t, n_remote, b0 * w + r1 - 1)))
            b0 += 1
            continue
        b1 = b0 + 1
        while b1 < n_blocks and _group_cost(t, batch_heads, n_remote, (b1 + 1 - b0) * w, (b1 + 1) * w - 1) <= t.group_logits:
            b1 += 1
        out.append(Group(b0, b1, 0, w, _visible_chunks(t, n_remote, b1 * w - 1)))
        b0 = b1
    return out


def _blocks(x: Tensor, b0: int, b1: int, w: int) -> Tensor:
    """Rows of blocks b0 … b1−1 of x (B, N, H, D) as (B, H, G, w, D), a view."""
    return x[:, b0 * w : b1 * w].unflatten(1, (b1 - b0, w)).permute(0, 3, 1, 2, 4)


def _queries(x: Tensor, g: Group, w: int) -> Tensor:
    """The group's rows of x (B, N, H, D) as (B, H, G, r1 − r0, D), a view."""
    return _blocks(x, g.b0, g.b1, w)[..., g.r0 : g.r1, :]


def _windows(x_pad: Tensor, t: Tiling, b0: int, b1: int) -> Tensor:
    """Local keys (or values) of blocks b0 … b1−1: (B, H, G, ext + w, D) from x (B, ext + N, H, D)
    left-padded by ext rows, as a view."""
    w = t.window
    if t.ext == 0:
        return _blocks(x_pad, b0, b1, w)
    return x_pad[:, b0 * w : b1 * w + t.ext].unfold(1, t.ext + w, w).permute(0, 2, 1, 4, 3)


def _add_windows(acc_pad: Tensor, grad: Tensor, t: Tiling, b0: int, b1: int) -> None:
    """Scatter-add a group's (B, H, G, ext + w, D) local-key gradients into the padded sequence."""
    w = t.window
    for at in range(0, t.ext + w, w):  # ext is 0 or w: one or two non-overlapping slabs
        acc_pad[:, b0 * w + at : b1 * w + at] += grad[..., at : at + w, :].permute(0, 2, 3, 1, 4).flatten(1, 2)


class Prologue(NamedTuple):
    """What every pass over the groups reads besides q: keys and values padded in front by ext
    zero rows (block 0's previous block), and the (w, ext + w) local mask of every block."""

    k_pad: Tensor
    v_pad: Tensor
    local_mask: Tensor

    @classmethod
    def of(cls, t: Tiling, k: Tensor, v: Tensor, bias: Tensor | None) -> Prologue:
        k_pad, v_pad = (torch.nn.functional.pad(x, (0, 0, 0, 0, t.ext, 0)) if t.ext else x for x in (k, v))
        return cls(k_pad, v_pad, t.local_mask(bias, k.device, k.dtype))


def _logits(t: Tiling, q: Tensor, pro: Prologue, rk: Tensor | None, g: Group, starts_sequence: bool = True
            ) -> tuple[Tensor, Tensor | None]:
    """Masked local (B, H, G, rows, ext + w) and remote (B, H, G·rows, n_vis) logits of one group
    (`starts_sequence`: block 0 of q is the sequence's first, its previous-block keys padding)."""
    qb = _queries(q, g, t.window) * t.scale  # scale the (rows, D) queries, not the (rows, keys) logits
    loc = torch.matmul(qb, _windows(pro.k_pad, t, g.b0, g.b1).transpose(-1, -2)).add_(pro.local_mask[g.r0 : g.r1])
    if g.b0 == 0 and t.ext and starts_sequence:  # block 0's previous-block keys are padding
        loc[:, :, 0, :, : t.ext] = float("-inf")
    if g.n_vis == 0:
        return loc, None
    rem = torch.matmul(qb.flatten(2, 3), rk[..., : g.n_vis, :].transpose(-1, -2))
    rows = g.rows(t.window)
    pos = torch.arange(rows.start, rows.stop, device=q.device)
    first = min(int(t.limit(rows.start)), g.n_vis)  # chunks before `first` are visible to every query here
    if first < g.n_vis:
        hidden = torch.arange(first, g.n_vis, device=q.device) >= t.limit(pos)[:, None]
        rem[..., first:].masked_fill_(hidden, float("-inf"))
    return loc, rem


def _keep_local(t: Tiling, group: Group, like: Tensor, first_block: int = 0) -> Tensor:
    """Dropout keep mask of a group's local logits (B, H, G, rows, ext + w), scaled by 1/(1 − p)
    (evalm/dropout_mask.py); its blocks are counted from `first_block`."""
    B, H = like.shape[:2]
    w = t.window
    blocks = torch.arange(first_block + group.b0, first_block + group.b1, device=like.device).view(-1, 1, 1)
    keep = dropout_mask.keep(t.seed, t.dropout, torch.arange(B, device=like.device).view(B, 1, 1, 1, 1),
                             torch.arange(H, device=like.device).view(1, H, 1, 1, 1),
                             blocks * w + torch.arange(group.r0, group.r1, device=like.device).view(-1, 1),
                             blocks * w - t.ext + torch.arange(t.ext + w, device=like.device))
    return keep.to(like.dtype).mul_(dropout_mask.scale(t.dropout))


def _keep_remote(t: Tiling, group: Group, like: Tensor) -> Tensor:
    """Dropout keep mask of a group's remote logits (B, H, G·rows, n_vis), scaled by 1/(1 − p)."""
    B, H = like.shape[:2]
    rows = group.rows(t.window)
    keep = dropout_mask.keep(t.seed, t.dropout, torch.arange(B, device=like.device).view(B, 1, 1, 1),
                             torch.arange(H, device=like.device).view(1, H, 1, 1),
                             torch.arange(rows.start, rows.stop, device=like.device).view(-1, 1),
                             dropout_mask.chunk_key(torch.arange(group.n_vis, device=like.device)))
    return keep.to(like.dtype).mul_(dropout_mask.scale(t.dropout))


def _keep_masks(t: Tiling, group: Group, loc: Tensor, rem: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """Dropout keep masks of a group's local and remote logits: the same in forward and backward."""
    return _keep_local(t, group, loc), (_keep_remote(t, group, rem) if rem is not None else None)


def attention_forward(x: Operands) -> tuple[Tensor, Tensor]:
    """q, k, v (B, N, H, D) with N a multiple of w; rk, rv (B, H, C, D) -> out (B, N, H, D), lse (B, H, N)."""
    t, q, rk, rv = x.t, x.q, x.rk, x.rv
    B, N, H, D = q.shape
    w = t.window
    pro = Prologue.of(t, x.k, x.v, x.bias)
    out, lse = torch.empty_like(q), q.new_empty(B, H, N)
    for group in groups(t, B * H, N // w, rk.shape[-2]):
        rows = group.rows(w)
        loc, rem = _logits(t, q, pro, rk, group)
        top = loc.amax(-1).flatten(2, 3)  # (B, H, G·rows): the row maximum over both parts
        if rem is not None:
            top = torch.maximum(top, rem.amax(-1))
        loc = loc.sub_(top.view(*loc.shape[:-1], 1))
        loc = loc.exp_()
        total = loc.sum(-1).flatten(2, 3)
        if rem is not None:
            rem = rem.sub_(top.unsqueeze(-1))
            rem = rem.exp_()
            total = total + rem.sum(-1)
        if t.dropout > 0:
            keep_loc, keep_rem = _keep_masks(t, group, loc, rem)
            loc = loc.mul_(keep_loc)
            rem = rem.mul_(keep_rem) if rem is not None else None
        o = torch.matmul(loc, _windows(pro.v_pad, t, group.b0, group.b1)).flatten(2, 3)
        if rem is not None:
            o = o + torch.matmul(rem, rv[..., : group.n_vis, :])
        out[:, rows] = o.div_(total.unsqueeze(-1)).transpose(1, 2)
        lse[..., rows] = top + total.log()
    return out, lse


def _softmax_grad(p: Tensor, dp: Tensor, keep: Tensor | None, row_dot: Tensor) -> Tensor:
    """dS = P ∘ (dP ∘ keep − D) in P's storage (FlashAttention's softmax backward; keep: the
    dropout mask, scaled by 1/(1 − p), or None)."""
    if keep is not None:
        dp = dp.mul_(keep)
    dp = dp.sub_(row_dot)
    return p.mul_(dp)


def attention_backward(x: Operands, y: Outputs) -> Gradients:
    """Gradients of attention_forward's output, recomputing each group's probabilities from lse:
    dq, dk, dv, d k̃, d β and d bias (None without a bias); d ω is the caller's (evalm/summaries.py)."""
    t, q, rk, rv, out, lse, d_out = x.t, x.q, x.rk, x.rv, y.out, y.lse, y.d_out
    B, N, H, D = q.shape
    w = t.window
    pro = Prologue.of(t, x.k, x.v, x.bias)
    dq, dk_pad, dv_pad = torch.empty_like(q), torch.zeros_like(pro.k_pad), torch.zeros_like(pro.v_pad)
    drk, drv = torch.zeros_like(rk), torch.zeros_like(rv)
    d_bias = torch.zeros(w, t.ext + w, dtype=q.dtype, device=q.device)
    for group in groups(t, B * H, N // w, rk.shape[-2]):
        b0, b1, r0, r1, n_vis = group
        rows = group.rows(w)
        loc, rem = _logits(t, q, pro, rk, group)
        loc = loc.sub_(lse[..., rows].view(*loc.shape[:-1], 1))
        p_loc = loc.exp_()  # P, before dropout
        p_rem = rem.sub_(lse[..., rows].unsqueeze(-1)).exp_() if rem is not None else None
        keep_loc, keep_rem = _keep_masks(t, group, p_loc, p_rem) if t.dropout > 0 else (None, None)
        # D_i per group: no (B, N, H) temporary of dO·O
        row_dot = (d_out[:, rows] * out[:, rows]).sum(-1).transpose(1, 2).unsqueeze(-1)  # (B, H, G·rows, 1)
        do_blocks = _queries(d_out, group, w)  # (B, H, G, rows, D)
        k_win, v_win = _windows(pro.k_pad, t, b0, b1), _windows(pro.v_pad, t, b0, b1)
        dp = torch.matmul(do_blocks, v_win.transpose(-1, -2))
        p_kept = p_loc * keep_loc if keep_loc is not None else p_loc
        _add_windows(dv_pad, torch.matmul(p_kept.transpose(-1, -2), do_blocks), t, b0, b1)
        ds = _softmax_grad(p_loc, dp, keep_loc, row_dot.unflatten(-2, (b1 - b0, r1 - r0)))
        d_bias[r0:r1] += ds.sum((0, 1, 2))
        q_blocks = _queries(q, group, w)
        dq_rows = torch.matmul(ds, k_win).flatten(2, 3)
        _add_windows(dk_pad, torch.matmul(ds.transpose(-1, -2), q_blocks).mul_(t.scale), t, b0, b1)
        if p_rem is not None:
            do_rows = do_blocks.flatten(2, 3)  # (B, H, G·rows, D)
            dp = torch.matmul(do_rows, rv[..., :n_vis, :].transpose(-1, -2))
            p_kept = p_rem * keep_rem if keep_rem is not None else p_rem
            drv[..., :n_vis, :] += torch.matmul(p_kept.transpose(-1, -2), do_rows)
            ds = _softmax_grad(p_rem, dp, keep_rem, row_dot)
            dq_rows += torch.matmul(ds, rk[..., :n_vis, :])
            drk[..., :n_vis, :] += torch.matmul(ds.transpose(-1, -2), q_blocks.flatten(2, 3)).mul_(t.scale)
        dq[:, rows] = dq_rows.mul_(t.scale).transpose(1, 2)
    return Gradients(dq, dk_pad[:, t.ext :], dv_pad[:, t.ext :], drk, drv, None, d_bias if x.bias is not None else None)


def local_bias_grad(x: Operands, y: Outputs, b0: int, b1: int) -> Tensor:
    """The T5 bias's gradient from blocks b0 … b1−1 alone, Σ over their blocks, sequences and heads
    of the local dS, recomputed from the joint log-sum-exp y.lse (B, N, H): the fused kernel returns
    none for its mask. Reads q, out, dO rows of the blocks and k, v rows from ext before them."""
    t, q, k, v, bias = x.t, x.q, x.k, x.v, x.bias
    B, N, H, D = q.shape
    w, r0, r1 = t.window, b0 * t.window, b1 * t.window
    if b0 == 0:  # block 0's previous-block keys are padding
        pro = Prologue.of(t, upcast(k[:, :r1]), upcast(v[:, :r1]), bias)
    else:  # the rows before the blocks are their real previous keys
        pro = Prologue(upcast(k[:, r0 - t.ext : r1]), upcast(v[:, r0 - t.ext : r1]), t.local_mask(bias, k.device, bias.dtype))
    q, out, d_out = (upcast(z[:, r0:r1]) for z in (q, y.out, y.d_out))  # bf16 rows: this pass in fp32
    lse = y.lse[:, r0:r1].transpose(1, 2)
    d_bias = torch.zeros(w, t.ext + w, dtype=q.dtype, device=q.device)
    for group in groups(t, B * H, b1 - b0, 0):  # local keys only: no chunk is visible
        rows = group.rows(w)
        loc, _ = _logits(t, q, pro, None, group, starts_sequence=b0 == 0)
        loc = loc.sub_(lse[..., rows].reshape(*loc.shape[:-1], 1))
        p = loc.exp_()
        row_dot = (d_out[:, rows] * out[:, rows]).sum(-1).transpose(1, 2).reshape(*loc.shape[:-1], 1)
        dp = torch.matmul(_queries(d_out, group, w), _windows(pro.v_pad, t, group.b0, group.b1).transpose(-1, -2))
        keep = _keep_local(t, group, p, first_block=b0) if t.dropout > 0 else None
        d_bias[group.r0 : group.r1] += _softmax_grad(p, dp, keep, row_dot).sum((0, 1, 2))
    return d_bias
