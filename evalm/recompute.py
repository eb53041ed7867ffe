"""EVA's training attention in linear memory: the FlashAttention recipe on EVA's block tiling.

The forward keeps only the output and each query's log-sum-exp (plus q, k, v and the chunk
summaries, all O(n·D)); the backward recomputes every tile's logits from them (Dao et al. 2022,
FlashAttention, Algorithm 2 in plain PyTorch ops). Autograd's graph of the same computation would
keep every tile's probabilities, O(n·(w + n/c)) per head, which at 32k tokens is several times the
memory of exact attention with a fused kernel.

Layout (EVA_SPEC §1.3-1.4). Queries are cut into blocks of w rows; block b's local keys are the
ext + w positions b·w − ext … b·w + w − 1, so one masked (w, ext + w) logit matrix per block
holds causality, the window and the T5 bias (the same for every block: it depends on i − j only).
Blocks run in groups; a group's queries share one read of the remote entries (k̃, β) they can see,
and a staircase mask keeps each query on the chunks r < ⌊i/c⌋ (or r < ⌊window start/c⌋ with
exclude_window_chunks, §1.7). Local and remote logits share one softmax: one max, one sum.

Attention dropout acts on the joint probabilities, as in the reference (§1.4 step 8). Its keep
masks come from a generator seeded per group from one seed drawn at forward time, so the backward
replays exactly the masks the forward used. Low-precision inputs run in fp32 (§8.8).

The same computation on PyTorch's fused CPU kernel (evalm/flash.py) is faster; `EvaRecompute`
takes it wherever it applies (no attention dropout, CPU tensors) and this path everywhere else.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from evalm import flash
from evalm.heads import upcast  # softmax work in at least fp32 (EVA_SPEC §8.8)
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


def groups(t: Tiling, batch_heads: int, n_blocks: int, n_remote: int) -> list[Group]:
    """The groups of a sequence, as large as the logit budget allows. A block whose own logits
    exceed it (its queries see many chunks) is cut into pieces of rows: the working set stays in
    cache and backward's transient (B, H, rows, n_vis) tensors stay small."""
    w, out, b0 = t.window, [], 0
    n_vis = lambda last: min(n_remote, t.limit(last))  # noqa: E731 the group's last query sees most
    cost = lambda rows, last: batch_heads * rows * (t.ext + w + n_vis(last))  # noqa: E731
    while b0 < n_blocks:
        if cost(w, b0 * w + w - 1) > t.group_logits:
            step = max(MIN_PIECE, t.group_logits // cost(1, b0 * w + w - 1))
            step = -(-w // -(-w // step))  # equal pieces: 120 rows would leave a thin 8-row piece
            out.extend(Group(b0, b0 + 1, r0, min(w, r0 + step), n_vis(b0 * w + min(w, r0 + step) - 1))
                       for r0 in range(0, w, step))
            b0 += 1
            continue
        b1 = b0 + 1
        while b1 < n_blocks and cost((b1 + 1 - b0) * w, (b1 + 1) * w - 1) <= t.group_logits:
            b1 += 1
        out.append(Group(b0, b1, 0, w, n_vis(b1 * w - 1)))
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


def _logits(t: Tiling, q: Tensor, k_pad: Tensor, rk: Tensor, local_mask: Tensor, g: Group) -> tuple[Tensor, Tensor | None]:
    """Masked local (B, H, G, rows, ext + w) and remote (B, H, G·rows, n_vis) logits of one group."""
    qb = _queries(q, g, t.window) * t.scale  # scale the (rows, D) queries, not the (rows, keys) logits
    loc = torch.matmul(qb, _windows(k_pad, t, g.b0, g.b1).transpose(-1, -2)).add_(local_mask[g.r0 : g.r1])
    if g.b0 == 0 and t.ext:  # block 0's previous-block keys are padding
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


def _keep_masks(t: Tiling, g: int, loc: Tensor, rem: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """Dropout keep masks of group g, scaled by 1/(1 − p): the same tensors in forward and backward."""
    gen = torch.Generator(device=loc.device)
    gen.manual_seed(t.seed + g)
    scale = 1.0 / (1.0 - t.dropout)

    def one(like: Tensor) -> Tensor:
        u = torch.rand(like.shape, generator=gen, device=like.device, dtype=like.dtype)
        return (u >= t.dropout).to(like.dtype).mul_(scale)

    return one(loc), (one(rem) if rem is not None else None)


def attention_forward(t: Tiling, q, k, v, rk, rv, bias) -> tuple[Tensor, Tensor]:
    """q, k, v (B, N, H, D) with N a multiple of w; rk, rv (B, H, C, D) -> out (B, N, H, D), lse (B, H, N)."""
    B, N, H, D = q.shape
    w = t.window
    k_pad, v_pad = (_pad_front(x, t.ext) for x in (k, v))
    local_mask = t.local_mask(bias, q.device, q.dtype)
    out, lse = torch.empty_like(q), q.new_empty(B, H, N)
    for g, group in enumerate(groups(t, B * H, N // w, rk.shape[-2])):
        b0, b1, _, _, n_vis = group
        rows = group.rows(w)
        loc, rem = _logits(t, q, k_pad, rk, local_mask, group)
        m = loc.amax(-1).flatten(2, 3)  # (B, H, G·rows)
        if rem is not None:
            m = torch.maximum(m, rem.amax(-1))
        loc = loc.sub_(m.view(*loc.shape[:-1], 1)).exp_()
        total = loc.sum(-1).flatten(2, 3)
        if rem is not None:
            rem = rem.sub_(m.unsqueeze(-1)).exp_()
            total = total + rem.sum(-1)
        if t.dropout > 0:
            keep_loc, keep_rem = _keep_masks(t, g, loc, rem)
            loc, rem = loc.mul_(keep_loc), (rem.mul_(keep_rem) if rem is not None else None)
        o = torch.matmul(loc, _windows(v_pad, t, b0, b1)).flatten(2, 3)
        if rem is not None:
            o = o + torch.matmul(rem, rv[..., :n_vis, :])
        out[:, rows] = o.div_(total.unsqueeze(-1)).transpose(1, 2)
        lse[..., rows] = m + total.log()
    return out, lse


def attention_backward(t: Tiling, q, k, v, rk, rv, bias, out, lse, d_out):
    """Gradients of attention_forward's output, recomputing each group's probabilities from lse:
    dq, dk, dv, d k̃, d β, d bias."""
    B, N, H, D = q.shape
    w = t.window
    k_pad, v_pad = (_pad_front(x, t.ext) for x in (k, v))
    local_mask = t.local_mask(bias, q.device, q.dtype)
    dq, dk_pad, dv_pad = torch.empty_like(q), torch.zeros_like(k_pad), torch.zeros_like(v_pad)
    drk, drv = torch.zeros_like(rk), torch.zeros_like(rv)
    d_bias = torch.zeros(w, t.ext + w, dtype=q.dtype, device=q.device)
    for g, group in enumerate(groups(t, B * H, N // w, rk.shape[-2])):
        b0, b1, r0, r1, n_vis = group
        rows = group.rows(w)
        loc, rem = _logits(t, q, k_pad, rk, local_mask, group)
        loc = loc.sub_(lse[..., rows].view(*loc.shape[:-1], 1)).exp_()  # P, before dropout
        rem = rem.sub_(lse[..., rows].unsqueeze(-1)).exp_() if rem is not None else None
        keep_loc, keep_rem = _keep_masks(t, g, loc, rem) if t.dropout > 0 else (None, None)
        # Σ_j P_ij dP_ij = dO_i · O_i (dropout included), per group: no (B, N, H) temporary of dO·O
        dl = (d_out[:, rows] * out[:, rows]).sum(-1).transpose(1, 2).unsqueeze(-1)  # (B, H, G·rows, 1)
        do_blocks = _queries(d_out, group, w)
        do = do_blocks.flatten(2, 3)
        kg, vg = _windows(k_pad, t, b0, b1), _windows(v_pad, t, b0, b1)
        dp = torch.matmul(do_blocks, vg.transpose(-1, -2))
        p_drop = loc * keep_loc if keep_loc is not None else loc
        _add_windows(dv_pad, torch.matmul(p_drop.transpose(-1, -2), do_blocks), t, b0, b1)
        ds = loc.mul_((dp.mul_(keep_loc) if keep_loc is not None else dp).sub_(dl.unflatten(-2, (b1 - b0, r1 - r0))))
        d_bias[r0:r1] += ds.sum((0, 1, 2))
        qb = _queries(q, group, w)
        dq_rows = torch.matmul(ds, kg).flatten(2, 3)
        _add_windows(dk_pad, torch.matmul(ds.transpose(-1, -2), qb).mul_(t.scale), t, b0, b1)
        if rem is not None:
            dp = torch.matmul(do, rv[..., :n_vis, :].transpose(-1, -2))
            p_drop = rem * keep_rem if keep_rem is not None else rem
            drv[..., :n_vis, :] += torch.matmul(p_drop.transpose(-1, -2), do)
            ds = rem.mul_((dp.mul_(keep_rem) if keep_rem is not None else dp).sub_(dl))
            dq_rows += torch.matmul(ds, rk[..., :n_vis, :])
            drk[..., :n_vis, :] += torch.matmul(ds.transpose(-1, -2), qb.flatten(2, 3)).mul_(t.scale)
        dq[:, rows] = dq_rows.mul_(t.scale).transpose(1, 2)
    return dq, dk_pad[:, t.ext :], dv_pad[:, t.ext :], drk, drv, (d_bias if bias is not None else None)


def local_bias_grad(t: Tiling, q, k, v, bias, out, lse, d_out) -> Tensor:
    """The T5 bias's gradient alone, Σ over blocks, sequences and heads of the local dS, recomputed
    from the joint log-sum-exp lse (B, H, N): the fused kernel returns none for its mask."""
    B, N, H, D = q.shape
    w = t.window
    k_pad, v_pad = (_pad_front(x, t.ext) for x in (k, v))
    local_mask = t.local_mask(bias, q.device, q.dtype)
    d_bias = torch.zeros(w, t.ext + w, dtype=q.dtype, device=q.device)
    for group in groups(t, B * H, N // w, 0):  # local keys only: no chunk is visible
        b0, b1, r0, r1, _ = group
        rows = group.rows(w)
        loc, _ = _logits(t, q, k_pad, None, local_mask, group)
        p = loc.sub_(lse[..., rows].reshape(*loc.shape[:-1], 1)).exp_()
        dl = (d_out[:, rows] * out[:, rows]).sum(-1).transpose(1, 2).reshape(*loc.shape[:-1], 1)
        dp = torch.matmul(_queries(d_out, group, w), _windows(v_pad, t, b0, b1).transpose(-1, -2))
        d_bias[r0:r1] += p.mul_(dp.sub_(dl)).sum((0, 1, 2))
    return d_bias


class EvaRecompute(torch.autograd.Function):
    """EVA attention whose backward recomputes the logits instead of storing them, on the fused
    kernel (evalm/flash.py) where it applies, in the plain PyTorch ops above elsewhere.

    The chunk summaries β are computed here too, from k, v and ω (§1.3), so their gradients land
    in place in dk and dv: autograd's graph of the summaries would keep, and in backward allocate,
    several sequence-sized products (k·ω, ‖k‖², weights·v and their gradients)."""

    @staticmethod
    def forward(ctx, q, k, v, rk, omega, bias, t: Tiling):
        work = [upcast(x).contiguous() for x in (q, k, v, rk, omega)]
        ctx.fused = flash.applies(t, work[0])
        attend = flash.forward if ctx.fused else attention_forward
        with torch.autocast(q.device.type, enabled=False):  # else bf16 autocast recasts every matmul
            beta, weights = summaries_forward(t, work[1], work[2], work[4])
            out, lse = attend(t, *work[:4], beta, upcast(bias) if bias is not None else None)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, rk, omega, bias, out, lse, beta, weights)
        ctx.tiling = t
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, rk, omega, bias, out, lse, beta, weights = ctx.saved_tensors
        t = ctx.tiling
        work = [upcast(x).contiguous() for x in (q, k, v, rk, omega)]
        b, o, do = (upcast(x) if x is not None else None for x in (bias, out, d_out))
        with torch.autocast(q.device.type, enabled=False):
            if ctx.fused:
                dq, dk, dv, drk, d_beta = flash.backward(t, *work[:4], beta, b, o, lse, do)
                d_bias = None
                if b is not None and ctx.needs_input_grad[5]:
                    d_bias = local_bias_grad(t, *work[:3], b, o, lse.transpose(1, 2), do)
            else:
                dq, dk, dv, drk, d_beta, d_bias = attention_backward(t, *work[:4], beta, b, o, lse, do)
            d_omega = summaries_backward(t, work[1], work[2], work[4], weights, d_beta, dk, dv)
        like = (q, k, v, rk, omega, bias)
        grads = (dq, dk, dv, drk, d_omega, d_bias)
        return (*(gr.to(x.dtype) if gr is not None else None for gr, x in zip(grads, like)), None)


def _chunk_rows(x: Tensor, b: int, h: int, n: int, c: int) -> Tensor:
    """The first n chunks of sequence b, head h of x (B, N, H, D) as an (n, c, D) view: a matmul
    operand with no copy (a view across heads and sequences could not be batched without one)."""
    return x[b, : n * c, h].unflatten(0, (n, c))


def summaries_forward(t: Tiling, k: Tensor, v: Tensor, omega: Tensor) -> tuple[Tensor, Tensor]:
    """β (B, H, n, D) of the n chunks whose ω (B, H, n, D) is given, and their softmax weights (B, H, n, c):
    β_r = Σ_j softmax_j(s·ω_r·k_j − s·‖k_j‖²/2) v_j over chunk r's keys (EVA_SPEC §1.3)."""
    B, _, H, D = k.shape
    n, c = omega.shape[-2], t.chunk
    beta, weights = k.new_empty(B, H, n, D), k.new_empty(B, H, n, c)
    for b in range(B):
        for h in range(H):
            kc, vc = _chunk_rows(k, b, h, n, c), _chunk_rows(v, b, h, n, c)
            lam = torch.bmm(kc, omega[b, h].unsqueeze(-1)).squeeze(-1).sub_(kc.pow(2).sum(-1).div_(2))
            weights[b, h] = torch.softmax(lam.mul_(t.scale), dim=-1)
            beta[b, h] = torch.bmm(weights[b, h].unsqueeze(1), vc).squeeze(1)
    return beta, weights


def summaries_backward(t: Tiling, k, v, omega, weights, d_beta, dk, dv) -> Tensor:
    """d ω (B, H, n, D); adds the summaries' gradients into dk and dv (B, N, H, D) in place."""
    B, _, H, D = k.shape
    n, c = omega.shape[-2], t.chunk
    d_omega = torch.empty_like(omega)
    for b in range(B):
        for h in range(H):
            kc, vc, wts = _chunk_rows(k, b, h, n, c), _chunk_rows(v, b, h, n, c), weights[b, h]
            _chunk_rows(dv, b, h, n, c).addcmul_(wts.unsqueeze(-1), d_beta[b, h].unsqueeze(1))
            dw = torch.bmm(vc, d_beta[b, h].unsqueeze(-1)).squeeze(-1)  # (n, c)
            dlam = wts * (dw - (wts * dw).sum(-1, keepdim=True)) * t.scale  # softmax backward, times s
            d_omega[b, h] = torch.bmm(dlam.unsqueeze(1), kc).squeeze(1)
            # d λ_j/d k_j = s·(ω − k_j), added in two passes: ω − k_j would be a chunk-sized temporary
            dkc = _chunk_rows(dk, b, h, n, c).addcmul_(dlam.unsqueeze(-1), omega[b, h].unsqueeze(1))
            dkc.addcmul_(dlam.unsqueeze(-1), kc, value=-1)
    return d_omega


def _pad_front(x: Tensor, rows: int) -> Tensor:
    """x (B, N, H, D) with `rows` zero rows in front (the previous block of block 0, with overlap)."""
    return torch.nn.functional.pad(x, (0, 0, 0, 0, rows, 0)) if rows else x


def eva_attention(t: Tiling, q: Tensor, k: Tensor, v: Tensor, rk: Tensor, omega: Tensor, bias: Tensor | None) -> Tensor:
    """Causal EVA over a whole sequence: q, k, v (B, T, H, D); k̃ and ω of the ⌊T/c⌋ chunks (B, H, ⌊T/c⌋, D)
    -> (B, T, H, D).

    The (B, T, H, D) layout is the projections' own, so neither the inputs nor the output are
    copied into a head-major layout (out_proj reads the output as a view). `bias` is the
    (w, ext + w) T5 bias of one block (query row, key column), already scaled by s.
    """
    T = q.shape[1]
    pad = -T % t.window  # right padding: a padded row is never a key of a real query
    if not pad:  # no slice: its backward would copy the output's gradient into a fresh tensor
        return EvaRecompute.apply(q, k, v, rk, omega, bias, t)
    q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
    return EvaRecompute.apply(q, k, v, rk, omega, bias, t)[:, :T]
