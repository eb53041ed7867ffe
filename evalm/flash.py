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

That path remains for what the kernel cannot do: attention dropout (the CPU kernel refuses
dropout_p > 0) and non-CPU tensors (see docs/model.md, "On a GPU"). The kernel returns no
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
import math
from typing import NamedTuple

import torch
from torch import Tensor

from evalm import dropout_mask
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
    if t.dropout > 0:
        return _forward_dropout(t, q, k, v, rk, rv, bias)
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
                   accumulation_dtype(q), {}, [torch.empty(0, dtype=torch.int32)] * 2)


def _local_drop_mask(t: Tiling, bias: Tensor | None, call: Local, keys: MaskKeys) -> Tensor:
    """The call's (G, H, w, keys) additive mask with attention dropout: the block mask where the
    key is kept (evalm/dropout_mask.py), −inf where dropped (a view of the scratch buffers). Block g of the call is block
    b0 + g % (b1 − b0) of sequence g // (b1 − b0) (or of `call.seq`), as `_rows` lays them out."""
    w, n = t.window, call.b1 - call.b0
    base = t.local_mask(bias, keys.rows.device, keys.dtype)
    base = base[:, t.ext :] if call.b0 == 0 else base  # as `_local_mask`
    rows = keys.rows[:, :, call.b0 * w : call.b1 * w] if call.seq is None else keys.rows[call.seq : call.seq + 1, :, call.b0 * w : call.b1 * w]
    rows = rows.unflatten(-1, (n, w)).transpose(1, 2).flatten(0, 1)  # (G, H, w)
    first_key = torch.arange(call.b0, call.b1) * w + w - base.shape[-1]  # ext before the block, or its own first row
    cols = keys.tokens[first_key[:, None] + torch.arange(base.shape[-1])].repeat(len(rows) // n, 1)  # (G, keys)
    shape = (*rows.shape, base.shape[-1])
    drop = dropout_mask.additive_of(rows.unsqueeze(-1), cols[:, None, None, :], t.dropout, keys.dtype, keys.buffers(shape))
    return drop.add_(base)  # −inf + anything stays −inf


def _remote_drop_mask(t: Tiling, g: Remote, chunks: slice, mask: Tensor | None, keys: MaskKeys) -> Tensor:
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


def _forward_dropout(t: Tiling, q: Tensor, k: Tensor, v: Tensor, rk: Tensor, rv: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor]:
    """`forward` with attention dropout on the joint probabilities P (docs/eva.md, "Attention dropout").

    The kernel has no dropout, but a dropped key is a −inf in its additive mask. Each part runs twice:
    with the dropout mask, for the kept keys' output o′_p and log-sum-exp ℓ′_p, and as without
    dropout, for ℓ_p (its output unused). Then o = e^(ℓ′ − ℓ)/(1 − p) · o′, with o′, ℓ′ merged over the
    parts like the outputs without dropout, and ℓ = log Σ_p e^ℓ_p the joint softmax's: every kept
    probability is P_ij/(1 − p), every dropped one 0. The calls for ℓ_p are `forward`'s own (no
    mask to build); the masked ones run a range (local) or a backward-sized group (remote) at a
    time, so each mask stays as small as backward's transients.
    """
    B, N, H, D = q.shape
    w = t.window
    work = accumulation_dtype(q)
    kept_out, kept_lse, lse = q.new_empty(B, N, H, D, dtype=work), q.new_empty(B, N, H, dtype=work), q.new_empty(B, N, H, dtype=work)
    keys = MaskKeys.of(t, q, rk.shape[-2])
    # ℓ_p: the kernel calls of `forward` without dropout (their outputs unused), in its call sizes
    low = work != q.dtype
    for call in _local_calls(t, B, 0, N // w, N // w) if not low else \
            [call for r in _ranges(t, N // w) for call in _local_calls(t, B, r.b0, r.b1, N // w)]:
        _rows(lse, call, w).copy_(_local_forward(t, call, q, k, v, bias)[1])
    rk, rv = rk.to(q.dtype), rv.to(q.dtype)
    for g in _remote_groups(t, 0, N, rk.shape[-2], ROWS):
        q_g = q[:, g.r0 : g.r1].transpose(1, 2)
        for chunks, mask, seen in _parts(t, g, q):
            _, part_lse = _FWD(q_g, rk[..., chunks, :], rv[..., chunks, :], attn_mask=mask, scale=t.scale)
            if seen is not None:
                part_lse.masked_fill_(~seen, float("-inf"))
            lse[:, g.r0 : g.r1] = torch.logaddexp(lse[:, g.r0 : g.r1], part_lse.transpose(1, 2))
    # o′_p, ℓ′_p: the same parts with the dropout mask, in tiles as small as backward's
    for r in _ranges(t, N // w)[::-1]:
        for call in _local_calls(t, B, r.b0, r.b1, N // w):
            q_c, k_c, v_c = _rows(q, call, w).to(work), _keys(k, t, call).to(work), _keys(v, t, call).to(work)
            drop = _local_drop_mask(t, bias, call, keys)
            o, part_kept = _FWD(q_c, k_c, v_c, attn_mask=drop, scale=t.scale)
            _rows(kept_out, call, w).copy_(o)
            _rows(kept_lse, call, w).copy_(_kept_lse(part_kept, drop))
    for g in _remote_groups(t, 0, N, rk.shape[-2], BACKWARD_ROWS):
        q_g = q[:, g.r0 : g.r1].transpose(1, 2)
        for chunks, mask, _ in _parts(t, g, q, piece=BACKWARD_CHUNKS):
            drop = _remote_drop_mask(t, g, chunks, mask, keys)
            o, part_kept = _FWD(q_g, rk[..., chunks, :], rv[..., chunks, :], attn_mask=drop, scale=t.scale)
            _merge(kept_out[:, g.r0 : g.r1], kept_lse[:, g.r0 : g.r1], o, _kept_lse(part_kept, drop))
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
    d_q, d_k, d_v = _BWD(d_out, q, k, v, keys.zero(out), lse + math.log1p(-t.dropout), 0.0, False,
                         attn_mask=drop, scale=t.scale)
    d_q2, d_k2, _ = _BWD(d_out, q, k, keys.zero(v), out, lse, 0.0, causal, attn_mask=mask, scale=t.scale)
    return d_q.add_(d_q2), d_k.add_(d_k2), d_v


def _local_backward_dropout(t: Tiling, call: Local, q, k, v, bias, out, lse, d_out, keys: MaskKeys) -> tuple[Tensor, Tensor, Tensor]:
    """`_local_backward` with attention dropout (`_dropped_backward`)."""
    w, work = t.window, accumulation_dtype(q)
    mask = _local_mask(t, bias, call, q)
    return _dropped_backward(t, _rows(d_out, call, w).to(work), _rows(q, call, w).to(work), _keys(k, t, call).to(work),
                             _keys(v, t, call).to(work), _rows(out, call, w).to(work), _rows(lse, call, w),
                             mask, mask is None, _local_drop_mask(t, bias, call, keys), keys)


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
                          keys: MaskKeys | None) -> None:
    """The local part's gradients of the range's queries, added into range buffers: dq_r (B, R, H, D)
    for rows b0·w …, dk_r and dv_r (B, ext + R, H, D) for rows b0·w − ext … (the previous block's
    keys, with overlap)."""
    w, shift = t.window, t.ext // t.window
    for call in _local_calls(t, q.shape[0], r.b0, r.b1, q.shape[1] // w):
        if keys is not None:
            d_q, d_k, d_v = _local_backward_dropout(t, call, q, k, v, bias, out, lse, d_out, keys)
        else:
            d_q, d_k, d_v = _local_backward(t, call, q, k, v, bias, out, lse, d_out)
        _rows(dq_r, _relative(call, r.b0), w).add_(d_q)
        own = _relative(call, r.b0 - shift)  # key rows of the call's own blocks in dk_r
        for acc, grad in ((dk_r, d_k), (dv_r, d_v)):
            if t.ext == 0 or call.b0 == 0:  # the keys are the blocks' own rows
                _rows(acc, own, w).add_(grad)
                continue
            _rows(acc, own._replace(b0=own.b0 - 1, b1=own.b1 - 1), w).add_(grad[..., : t.ext, :])
            _rows(acc, own, w).add_(grad[..., t.ext :, :])


def _remote_range_backward(t: Tiling, r: Range, q, rk, rv, out, lse, d_out, dq_r: Tensor, drk: Tensor, drv: Tensor,
                           keys: MaskKeys | None) -> None:
    """The remote parts' gradients of the range's queries: into dq_r, and d k̃, d β (B, H, C, D);
    rk, rv and the accumulators in fp32 (or fp64)."""
    start = r.b0 * t.window
    for g in _remote_groups(t, start, r.b1 * t.window, rk.shape[-2], BACKWARD_ROWS):
        rows = slice(g.r0, g.r1)
        # the group's rows, head-major for the kernel: dO, q, O (B, H, R, D) and ℓ (B, H, R); in fp32
        # for bf16 inputs: the kernel's bf16 backward measured several times slower than its fp32 one
        d_out_g, q_g, out_g, lse_g = (x[:, rows].transpose(1, 2).to(accumulation_dtype(x)) for x in (d_out, q, out, lse))
        for chunks, mask, _ in _parts(t, g, q, piece=BACKWARD_CHUNKS):
            if keys is not None:
                d_q, d_k_tilde, d_beta = _dropped_backward(t, d_out_g, q_g, rk[..., chunks, :], rv[..., chunks, :], out_g, lse_g,
                                                           mask, False, _remote_drop_mask(t, g, chunks, mask, keys), keys)
            else:
                d_q, d_k_tilde, d_beta = _BWD(d_out_g, q_g, rk[..., chunks, :], rv[..., chunks, :], out_g, lse_g, 0.0,
                                              False, attn_mask=mask, scale=t.scale)
            dq_r[:, g.r0 - start : g.r1 - start] += d_q.transpose(1, 2)
            drk[..., chunks, :] += d_k_tilde
            drv[..., chunks, :] += d_beta


def backward(t: Tiling, q, k, v, rk, rv, bias, out, lse, d_out, drk: Tensor, drv: Tensor, finish) -> None:
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
    keys = MaskKeys.of(t, q, rk.shape[-2]) if t.dropout > 0 else None  # before q's rows turn into dq's
    for r in _ranges(t, N // w):
        r0, r1 = r.b0 * w, r.b1 * w
        dq_r = torch.zeros(B, r1 - r0, H, D, dtype=accumulation_dtype(q))  # fp32 sums for bf16 gradients
        dk_r, dv_r = (torch.zeros(B, ext + r1 - r0, H, D, dtype=dq_r.dtype) for _ in range(2))
        if carry is not None:
            dk_r[:, -w:] += carry[0]
            dv_r[:, -w:] += carry[1]
        _local_range_backward(t, r, q, k, v, bias, out, lse, d_out, dq_r, dk_r, dv_r, keys)
        _remote_range_backward(t, r, q, rk, rv, out, lse, d_out, dq_r, drk, drv, keys)
        carry = (dk_r[:, :ext], dv_r[:, :ext]) if ext else None
        finish(r0, r1, dk_r[:, ext:], dv_r[:, ext:])
        q[:, r0:r1] = dq_r
        k[:, r0:r1] = dk_r[:, ext:]
        v[:, r0:r1] = dv_r[:, ext:]
