"""One softmax over several key sets that are never concatenated: the split-softmax paths of EVA.

A test input scored over thousands of cached chunk summaries (incremental scoring) would
otherwise copy every summary into one key tensor per layer and call: at the 350M shape and 2,000
demonstrations that copy cost as much as the attention itself. Each key set gets its own logits;
one max and one sum across the sets give the joint softmax (docs/eva.md, "The closed form").

Legend:
  B sequences, H heads, R query rows per sequence, D head dimension, K_p keys of set p
  q        (B, H, R, D), already scaled by s
  keys[p], values[p]   (B, 1, H, K_p, D); a *shared* set has batch 1 or stride 0 over the batch
                       (a parent cache's entries, broadcast over its forks)
  masks    (1, R, Σ K_p) additive, one column per key, split into the sets' widths
  ℓ_p      the log-sum-exp of a set's logits, (B, H, R); parts combine as
           ℓ = log Σ_p exp ℓ_p,  o = Σ_p exp(ℓ_p − ℓ)·o_p
A shared set is read once against the batch's rows folded into one block of B·R rows (a batched
matmul would copy it once per sequence); when every row sees all of it, PyTorch's fused CPU kernel
(evalm/flash.py) attends to it and its (o_p, ℓ_p) joins the rest.
"""

from __future__ import annotations

import torch
from torch import Tensor

from evalm import flash


def fold(x: Tensor) -> Tensor:
    """(B, H, R, ·) -> (1, H, B·R, ·): the batch's rows as one block."""
    B, H, R, last = x.shape
    return x.transpose(0, 1).reshape(1, H, B * R, last)


def unfold(x: Tensor, batch: int) -> Tensor:
    """(1, H, B·R, ·) -> (B, H, R, ·), a view: the inverse of `fold`."""
    _, H, rows, last = x.shape
    return x.view(H, batch, rows // batch, last).transpose(0, 1)


def _is_shared(k: Tensor) -> bool:
    return k.shape[0] == 1 or k.stride(0) == 0


def _kernel_part(q_folded: Tensor, k: Tensor, v: Tensor, mask: Tensor, batch: int) -> tuple[Tensor, Tensor]:
    """(o_p, ℓ_p) of a shared set that every row sees, on the fused kernel."""
    kernel_mask = mask[0].repeat(batch, 1) if mask.any() else None
    o, lse = flash.attend(q_folded, k[:1, 0], v[:1, 0], kernel_mask)
    return unfold(o, batch), unfold(lse.unsqueeze(-1), batch).squeeze(-1)


def _logits(q: Tensor, q_folded: Tensor | None, k: Tensor, mask: Tensor) -> Tensor:
    """Masked logits (B, H, R, K_p) of one set: a shared set against the folded rows."""
    if _is_shared(k):
        logits = unfold(torch.matmul(q_folded, k[:1, 0].transpose(-1, -2)), q.shape[0])
    else:
        logits = torch.matmul(q, k[:, 0].transpose(-1, -2))
    return logits.add_(mask)


def _weighted_values(p: Tensor, v: Tensor, shared: bool) -> Tensor:
    """p (B, H, R, K_p) times one set's values -> (B, H, R, D)."""
    if shared:
        return unfold(torch.matmul(fold(p), v[:1, 0]), p.shape[0])
    return torch.matmul(p, v[:, 0])


def _matmul_part(q: Tensor, q_folded: Tensor | None, keys: list[Tensor], values: list[Tensor],
                 masks: list[Tensor]) -> tuple[Tensor, Tensor]:
    """(o_p, ℓ_p) of several sets together, in plain ops: one max and one sum over all their logits."""
    logits = [_logits(q, q_folded, k, m) for k, m in zip(keys, masks)]
    top = torch.stack([lg.amax(-1) for lg in logits]).amax(0).unsqueeze(-1)  # (B, H, R, 1)
    total = torch.zeros_like(top)
    out = torch.zeros_like(q)
    for lg, k, v in zip(logits, keys, values):
        p = lg.sub_(top)
        p = p.exp_()
        total += p.sum(-1, keepdim=True)
        out += _weighted_values(p, v, _is_shared(k))
    out = out.div_(total)
    return out, (top + total.log()).squeeze(-1)


def joint_softmax(q: Tensor, keys: list[Tensor], values: list[Tensor], masks: list[Tensor]) -> Tensor:
    """o (B, H, R, D) = softmax over all sets' keys jointly, times their values (legend above)."""
    B = q.shape[0]
    q_folded = fold(q) if any(_is_shared(k) for k in keys) else None
    masks = torch.cat(masks, -1).split([k.shape[-2] for k in keys], -1)  # one mask may span several sets
    parts, rest = [], []
    for k, v, m in zip(keys, values, masks):
        on_kernel = _is_shared(k) and k.shape[-2] > 0 and flash.usable_on(q) and bool(torch.isfinite(m).all())
        if on_kernel:
            parts.append(_kernel_part(q_folded, k, v, m, B))
        else:
            rest.append((k, v, m))
    if rest:
        parts.append(_matmul_part(q, q_folded, *map(list, zip(*rest))))
    lse = torch.stack([part_lse for _, part_lse in parts]).logsumexp(0)
    return sum(o * (part_lse - lse).exp().unsqueeze(-1) for o, part_lse in parts)
