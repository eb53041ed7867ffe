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
  prefix  a group of queries (768 rows in forward) against the chunks all of them see: no mask;
  tail    the same queries against the chunks that become visible inside the group: a small
          staircase mask (rows, rows/c).
So the work runs at the fused kernel's speed on views of q, k, v and the summaries, and the
forward keeps only the output and ℓ, as the plain-PyTorch path (evalm/recompute.py) does.

This module holds the kernel call (`Kernel`), the parts' layout and the merge. The passes over
the parts (forward `sweep`, `backward`) are evalm/flash_sweep.py, written once for any `Parts`:
`flash_sweep.EXACT` (one kernel call per part) or `flash_dropout.Dropped` (attention dropout,
which the kernel refuses as dropout_p > 0: a −inf per dropped key in its mask, each part run
twice). The plain path remains for non-CPU tensors (see docs/model.md, "On a GPU"). The kernel
returns no gradient for its mask, so the T5 bias's gradient comes from recompute.local_bias_grad.
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
  Part(group, chunks, mask, seen)  one kernel call of a remote group: some of its chunks
  x, y                           the call's `Operands` and backward's `Outputs` (evalm/operands.py)
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
from torch import Tensor

from evalm.operands import Operands, Outputs
from evalm.tiling import Tiling

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


class PartGrad(NamedTuple):
    """What the kernel's backward reads of one call's rows besides its inputs, head-major like them."""

    d_out: Tensor  # (batch, H, rows, D)
    out: Tensor  # (batch, H, rows, D) the joint output
    lse: Tensor  # (batch, H, rows) the joint ℓ


class Kernel(NamedTuple):
    """One call of the fused kernel: q (batch, H, rows, D) against k, v (batch, H, keys, D), with an
    additive (rows, keys) mask, or none with `causal` (the kernel's own causal mask)."""

    q: Tensor
    k: Tensor
    v: Tensor
    mask: Tensor | None
    causal: bool = False

    def forward(self, scale: float) -> tuple[Tensor, Tensor]:
        """Output (batch, H, rows, D) and log-sum-exp (batch, H, rows). Every row must see a key."""
        return _FWD(self.q, self.k, self.v, is_causal=self.causal, attn_mask=self.mask, scale=scale)

    def backward(self, scale: float, grad: PartGrad) -> tuple[Tensor, Tensor, Tensor]:
        """dq, dk, dv, the probabilities recomputed as exp(s − ℓ) from the ℓ given."""
        return _BWD(grad.d_out, self.q, self.k, self.v, grad.out, grad.lse, 0.0, self.causal, attn_mask=self.mask,
                    scale=scale)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Softmax attention of q (B, H, L, D), already scaled, over k, v (B, H, S, D) with an additive
    (L, S) mask or none: output (B, H, L, D) and log-sum-exp (B, H, L). Every row must see a key."""
    return Kernel(q, k, v, mask).forward(1.0)


# ---------------------------------------------------------------------------------- the local part

class Local(NamedTuple):
    """One kernel call of the local part: blocks b0 … b1−1 of one sequence, or of all (seq None)."""

    seq: int | None
    b0: int
    b1: int


def local_calls(t: Tiling, batch: int, b0: int, b1: int, n_blocks: int) -> list[Local]:
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


def block_rows(x: Tensor, call: Local, w: int) -> Tensor:
    """The call's rows of x (B, N, H, ...) as (G, H, w, ...), a view (a copy would be an error)."""
    part = x[:, call.b0 * w : call.b1 * w] if call.seq is None else x[call.seq, call.b0 * w : call.b1 * w].unsqueeze(0)
    return part.view(-1, w, *x.shape[2:]).transpose(1, 2)


def window_keys(x: Tensor, t: Tiling, call: Local) -> Tensor:
    """Local keys (or values) of the call's blocks, (G, H, ext + w, D): windows overlapping by ext
    rows, as one strided view of the contiguous x (B, N, H, D)."""
    if t.ext == 0 or call.b0 == 0:  # block 0 with overlap: its own w keys only
        return block_rows(x, call, t.window)
    w, (_, _, H, D) = t.window, x.shape
    seq = x[call.seq]
    return seq.as_strided((call.b1 - call.b0, H, t.ext + w, D), (w * H * D, D, H * D, 1),
                          seq.storage_offset() + (call.b0 * w - t.ext) * H * D)


def block_mask(x: Operands, call: Local) -> Tensor:
    """The (w, ext + w) additive mask of every block of the call: T5 bias where visible, −inf after
    the query; block 0 with overlap keeps its last w columns (it has no previous block)."""
    mask = x.t.local_mask(x.bias, x.q.device, accumulation_dtype(x.q))
    return mask[:, x.t.ext :] if call.b0 == 0 else mask


def local_mask(x: Operands, call: Local) -> Tensor | None:
    """`block_mask`, or None where it is plain causality (`Tiling.plain_causal`): the kernel's own."""
    return None if x.t.plain_causal(x.bias) else block_mask(x, call)


def local_kernel(x: Operands, call: Local, mask: Tensor | None) -> Kernel:
    """The kernel call of the call's blocks with `mask` (None: causal). bf16 blocks run in fp32:
    the kernel's bf16 path is slower on w-row causal blocks (2x at w = 128)."""
    w, work = x.t.window, accumulation_dtype(x.q)
    return Kernel(block_rows(x.q, call, w).to(work), window_keys(x.k, x.t, call).to(work),
                  window_keys(x.v, x.t, call).to(work), mask, mask is None)


def local_grad(x: Operands, y: Outputs, call: Local) -> PartGrad:
    """Backward's rows of the call's blocks, dO and O in fp32 for bf16 inputs (as `local_kernel`)."""
    w, work = x.t.window, accumulation_dtype(x.q)
    return PartGrad(block_rows(y.d_out, call, w).to(work), block_rows(y.out, call, w).to(work), block_rows(y.lse, call, w))


# --------------------------------------------------------------------------------- the remote part

class Remote(NamedTuple):
    """Queries r0 … r1−1, the chunks [0, prefix) all of them see, and [prefix, end) some of them."""

    r0: int
    r1: int
    prefix: int
    end: int


class Part(NamedTuple):
    """One kernel call of a remote group: its chunks, their mask (None for the prefix, a staircase
    for the tail) and the rows that see any of them (None: all); or, `selected`, the group's chosen
    tokens with selection (evalm/flash_selection.py: written out, no summary)."""

    group: Remote
    chunks: slice
    mask: Tensor | None
    seen: Tensor | None
    selected: bool = False


def remote_groups(t: Tiling, start: int, stop: int, n_remote: int, rows: int) -> list[Remote]:
    """Groups of at most `rows` queries from start to stop that see some chunk."""
    out = []
    for r0 in range(start, stop, rows):
        r1 = min(stop, r0 + rows)
        end = min(n_remote, t.limit(r1 - 1))  # the group's last query sees most
        if end > 0:
            out.append(Remote(r0, r1, min(n_remote, t.limit(r0)), end))
    return out


def remote_parts(t: Tiling, g: Remote, like: Tensor, piece: int | None = None) -> list[Part]:
    """The group's prefix and tail calls; the prefix in calls of at most `piece` chunks (backward:
    each call returns gradients as wide as its chunks). With selection the selected part comes last, and
    with `select_only` it is the only one (no summary enters the softmax)."""
    selected = [Part(g, slice(0, 0), None, None, selected=True)] if t.select else []
    if t.select_only:
        return selected
    piece = piece or max(1, g.prefix)
    parts = [Part(g, slice(a, min(g.prefix, a + piece)), None, None) for a in range(0, g.prefix, piece)]
    if g.end > g.prefix:
        pos = torch.arange(g.r0, g.r1, device=like.device)[:, None]
        visible = g.prefix + torch.arange(g.end - g.prefix, device=like.device) < t.limit(pos)
        mask = like.new_zeros(visible.shape, dtype=accumulation_dtype(like)).masked_fill_(~visible, float("-inf"))
        parts.append(Part(g, slice(g.prefix, g.end), mask, visible.any(-1)))
    return parts + selected


def remote_kernel(x: Operands, q_g: Tensor, chunks: slice, mask: Tensor | None) -> Kernel:
    """The kernel call of a group's queries q_g (B, H, R, D) against some of its chunks."""
    return Kernel(q_g, x.rk[..., chunks, :], x.rv[..., chunks, :], mask)


def merge(acc_o: Tensor | None, acc_l: Tensor, o: Tensor, lse: Tensor) -> None:
    """Fold one part's output o (B, H, R, D) and ℓ (B, H, R) into acc_o (B, R, H, D), acc_l (B, R, H):
    ℓ' = log(e^ℓ_acc + e^ℓ_p), o' = e^(ℓ_acc − ℓ')·o_acc + e^(ℓ_p − ℓ')·o_p (acc_o None: ℓ alone)."""
    lse = lse.transpose(1, 2)
    total = torch.logaddexp(acc_l, lse)
    if acc_o is not None:
        # nan_to_num: with dropout a row may keep no key of either side (ℓ = −inf on both), its output 0
        acc_o.mul_((acc_l - total).exp_().nan_to_num_(0.0).unsqueeze(-1))
        acc_o.add_(o.transpose(1, 2) * (lse - total).exp_().nan_to_num_(0.0).unsqueeze(-1))
    acc_l.copy_(total)
