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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

GROUP_LOGITS = 1 << 18  # logits per group (B·H·rows·keys): bounds the working set of one group


@dataclass(frozen=True)
class Tiling:
    """The static shape of one EVA attention call."""

    window: int  # w
    chunk: int  # c
    ext: int  # 0, or w with overlap_window
    exclude_window_chunks: bool
    scale: float  # s = D^-1/2
    dropout: float = 0.0  # attention dropout on the joint probabilities (0 outside training)
    seed: int = 0  # dropout masks of group g come from a generator seeded with seed + g
    group_logits: int = GROUP_LOGITS

    def limit(self, pos: Tensor | int):
        """Remote chunks visible to the query at `pos`: r < limit (§1.3, §1.7)."""
        if self.exclude_window_chunks:
            start = pos // self.window * self.window - self.ext
            return (start.clamp(min=0) if isinstance(start, Tensor) else max(0, start)) // self.chunk
        return pos // self.chunk


def groups(t: Tiling, batch_heads: int, n_blocks: int, n_remote: int) -> list[tuple[int, int, int]]:
    """(first block, end block, visible chunks) of each group, as large as the logit budget allows."""
    w, out, b0 = t.window, [], 0
    n_vis = lambda end: min(n_remote, t.limit(end * w - 1))  # noqa: E731 the group's last query sees most
    while b0 < n_blocks:
        b1 = b0 + 1
        while b1 < n_blocks and batch_heads * (b1 + 1 - b0) * w * (t.ext + w + n_vis(b1 + 1)) <= t.group_logits:
            b1 += 1
        out.append((b0, b1, n_vis(b1)))
        b0 = b1
    return out


def _blocks(x: Tensor, b0: int, b1: int, w: int) -> Tensor:
    """Rows of blocks b0 … b1−1 of x (B, N, H, D) as (B, H, G, w, D), a view."""
    return x[:, b0 * w : b1 * w].unflatten(1, (b1 - b0, w)).permute(0, 3, 1, 2, 4)


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


def _local_mask(t: Tiling, bias: Tensor | None, device, dtype) -> Tensor:
    """Additive (w, ext + w) mask of one block: T5 bias where visible, −inf elsewhere (causal)."""
    w = t.window
    rows, cols = torch.arange(w, device=device)[:, None], torch.arange(t.ext + w, device=device)
    visible = cols <= rows + t.ext
    base = bias.to(dtype) if bias is not None else torch.zeros(w, t.ext + w, dtype=dtype, device=device)
    return base.masked_fill(~visible, float("-inf"))


def _logits(t: Tiling, q: Tensor, k_pad: Tensor, rk: Tensor, local_mask: Tensor, group) -> tuple[Tensor, Tensor | None]:
    """Masked local (B, H, G, w, ext + w) and remote (B, H, G·w, n_vis) logits of one group."""
    b0, b1, n_vis = group
    w = t.window
    qb = _blocks(q, b0, b1, w) * t.scale  # scale the (rows, D) queries, not the (rows, keys) logits
    loc = torch.matmul(qb, _windows(k_pad, t, b0, b1).transpose(-1, -2)).add_(local_mask)
    if b0 == 0 and t.ext:  # block 0's previous-block keys are padding
        loc[:, :, 0, :, : t.ext] = float("-inf")
    if n_vis == 0:
        return loc, None
    rem = torch.matmul(qb.flatten(2, 3), rk[..., :n_vis, :].transpose(-1, -2))
    pos = torch.arange(b0 * w, b1 * w, device=q.device)
    first = min(int(t.limit(b0 * w)), n_vis)  # chunks before `first` are visible to every query here
    if first < n_vis:
        hidden = torch.arange(first, n_vis, device=q.device) >= t.limit(pos)[:, None]
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
    local_mask = _local_mask(t, bias, q.device, q.dtype)
    out, lse = torch.empty_like(q), q.new_empty(B, H, N)
    for g, group in enumerate(groups(t, B * H, N // w, rk.shape[-2])):
        b0, b1, n_vis = group
        loc, rem = _logits(t, q, k_pad, rk, local_mask, group)
        m = loc.amax(-1).flatten(2, 3)  # (B, H, G·w)
        if rem is not None:
            m = torch.maximum(m, rem.amax(-1))
        loc = loc.sub_(m.view(B, H, b1 - b0, w, 1)).exp_()
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
        out[:, b0 * w : b1 * w] = (o / total.unsqueeze(-1)).transpose(1, 2)
        lse[..., b0 * w : b1 * w] = m + total.log()
    return out, lse


def attention_backward(t: Tiling, q, k, v, rk, rv, bias, out, lse, d_out):
    """Gradients of attention_forward's output, recomputing each group's probabilities from lse."""
    B, N, H, D = q.shape
    w = t.window
    k_pad, v_pad = (_pad_front(x, t.ext) for x in (k, v))
    local_mask = _local_mask(t, bias, q.device, q.dtype)
    dq, dk_pad, dv_pad = torch.empty_like(q), torch.zeros_like(k_pad), torch.zeros_like(v_pad)
    drk, drv = torch.zeros_like(rk), torch.zeros_like(rv)
    d_bias = torch.zeros(w, t.ext + w, dtype=q.dtype, device=q.device)
    for g, group in enumerate(groups(t, B * H, N // w, rk.shape[-2])):
        b0, b1, n_vis = group
        rows = slice(b0 * w, b1 * w)
        loc, rem = _logits(t, q, k_pad, rk, local_mask, group)
        loc = loc.sub_(lse[..., rows].view(B, H, b1 - b0, w, 1)).exp_()  # P, before dropout
        rem = rem.sub_(lse[..., rows].unsqueeze(-1)).exp_() if rem is not None else None
        keep_loc, keep_rem = _keep_masks(t, g, loc, rem) if t.dropout > 0 else (None, None)
        # Σ_j P_ij dP_ij = dO_i · O_i (dropout included), per group: no (B, N, H) temporary of dO·O
        dl = (d_out[:, rows] * out[:, rows]).sum(-1).transpose(1, 2).unsqueeze(-1)  # (B, H, G·w, 1)
        do_blocks = _blocks(d_out, b0, b1, w)
        do = do_blocks.flatten(2, 3)
        kg, vg = _windows(k_pad, t, b0, b1), _windows(v_pad, t, b0, b1)
        dp = torch.matmul(do_blocks, vg.transpose(-1, -2))
        p_drop = loc * keep_loc if keep_loc is not None else loc
        _add_windows(dv_pad, torch.matmul(p_drop.transpose(-1, -2), do_blocks), t, b0, b1)
        ds = loc.mul_((dp.mul_(keep_loc) if keep_loc is not None else dp).sub_(dl.unflatten(-2, (b1 - b0, w))))
        d_bias += ds.sum((0, 1, 2))
        qb = _blocks(q, b0, b1, w)
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


class EvaRecompute(torch.autograd.Function):
    """EVA attention whose backward recomputes the logits instead of storing them."""

    @staticmethod
    def forward(ctx, q, k, v, rk, rv, bias, t: Tiling):
        work = [_fp32(x) for x in (q, k, v, rk, rv)]
        with torch.autocast(q.device.type, enabled=False):  # else bf16 autocast recasts every matmul
            out, lse = attention_forward(t, *work, _fp32(bias) if bias is not None else None)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, rk, rv, bias, out, lse)
        ctx.tiling = t
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, rk, rv, bias, out, lse = ctx.saved_tensors
        work = [_fp32(x) for x in (q, k, v, rk, rv)]
        with torch.autocast(q.device.type, enabled=False):
            grads = attention_backward(ctx.tiling, *work, _fp32(bias) if bias is not None else None,
                                       _fp32(out), lse, _fp32(d_out))
        like = (q, k, v, rk, rv, bias)
        return (*(gr.to(x.dtype) if gr is not None else None for gr, x in zip(grads, like)), None)


def _pad_front(x: Tensor, rows: int) -> Tensor:
    """x (B, N, H, D) with `rows` zero rows in front (the previous block of block 0, with overlap)."""
    return torch.nn.functional.pad(x, (0, 0, 0, 0, rows, 0)) if rows else x


def _fp32(x: Tensor) -> Tensor:
    """Softmax work in at least fp32 (EVA_SPEC §8.8); float64 stays float64 for the exact tests."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def eva_attention(t: Tiling, q: Tensor, k: Tensor, v: Tensor, rk: Tensor, rv: Tensor, bias: Tensor | None) -> Tensor:
    """Causal EVA over a whole sequence: q, k, v (B, T, H, D), summaries (B, H, ⌊T/c⌋, D) -> (B, T, H, D).

    The (B, T, H, D) layout is the projections' own, so neither the inputs nor the output are
    copied into a head-major layout (out_proj reads the output as a view). `bias` is the
    (w, ext + w) T5 bias of one block (query row, key column), already scaled by s.
    """
    T = q.shape[1]
    pad = -T % t.window  # right padding: a padded row is never a key of a real query
    if pad:
        q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, 0, 0, pad)) for x in (q, k, v))
    return EvaRecompute.apply(q, k, v, rk, rv, bias, t)[:, :T]
