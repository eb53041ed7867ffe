"""Selection inside EVA's memory: each query reads exactly the tokens of the k chunks its summaries score
highest (docs/eva.md, "Selection"; NSA's selection branch, Yuan et al. 2025, §3.3.2; MoBA's gate, Lu et al. 2025).

EVA already scores every remote chunk r for the query at i: its summary's logit s·q_i·k̃_r in the joint
softmax. Selection ranks the candidates by it (the chunks before the query's window that it may see,
`Tiling.candidate_count`), takes the top k (ties to the earlier chunk), and lets their c tokens join the
query's exact keys while their summaries leave the softmax, so no chunk's mass is counted twice. With
`select_only` no summary stays: the window, the sink and the selected tokens are the keys, and the
summaries only choose. Heads that share one K/V head (a grouped-query host) share one choice, made from
their scores summed (NSA's group-consistent selection). The choice carries no gradient; what it selects does.

With `select_by = "bound"` Quest's bound ranks them instead (`bound_scores`, from each chunk's `key_bounds`; with
"window-bound" the bounds of its keys placed right before the query's window, one distance for every chunk): a
model whose summaries were never trained to route (a converted one) keeps EVA's softmax and reads with it.

The tiles route (evalm/tile_selection.py) calls `choose` and `gather` for every query of a call, whole sequence or
cached; `chunk_tokens` is the slice of a sequence a whole-sequence call reads the tokens from.

Legend: B sequences, G tiles, H heads, R query rows, n candidate summaries, k the chunks chosen, c tokens per
chunk, D the head dimension.
"""

from __future__ import annotations

import torch
from torch import Tensor


def choose(scores: Tensor, k: int, group: int, mask: bool = True) -> tuple[Tensor | None, Tensor, Tensor]:
    """The chunks each query reads exactly: scores (B, G, H, R, n), the candidates' logits (−inf for a chunk
    that is not a candidate) -> chosen (B, G, H, R, n) booleans, and the chosen chunks' indices (B, G, H, R, k)
    in chunk order with `valid` (B, G, H, R, k), False where a query had fewer than k candidates.

    The top k by score; among equal scores at the cut the earlier chunks (torch.topk does not order ties).
    Heads in consecutive groups of `group` rank their summed scores, so a group reads one set of chunks.
    Where no query has a tie at the cut (its k-th score above its (k+1)-th; float logits almost never tie)
    one topk decides; otherwise `_choose_ties` takes the earliest of the tied chunks, several passes over n.
    Without `mask`, `chosen` is None where one topk decided (a pass over n saved: the indices say the same)."""
    B, G, H, R, n = scores.shape
    k = min(k, n)
    if k == 0:
        empty = scores.new_zeros(B, G, H, R, 0, dtype=torch.long)
        return torch.zeros_like(scores, dtype=torch.bool), empty, empty.bool()
    summed = scores.detach()
    if group > 1:  # −inf stays −inf: a group shares its candidates
        summed = summed.unflatten(2, (H // group, group)).sum(3)
    top = summed.topk(min(k + 1, n), -1)
    if k < n:
        cut, after = top.values[..., k - 1], top.values[..., k]
        if bool(((cut == after) & (cut > float("-inf"))).any()):
            return _spread(_choose_ties(summed, k), group)
    valid = top.values[..., :k] > float("-inf")
    ordered = torch.where(valid, top.indices[..., :k], n).sort(-1).values  # chunk order, the missing (n) last
    valid = ordered < n
    chosen = summed.new_zeros(*summed.shape[:-1], n + 1, dtype=torch.bool).scatter_(-1, ordered, True)[..., :n] if mask else None
    return _spread((chosen, torch.where(valid, ordered, 0), valid), group)


def _choose_ties(summed: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """`choose` where some query ties at the cut: every score above the k-th, then the tied ones earliest first."""
    n = summed.shape[-1]
    cut = summed.topk(k, -1).values[..., -1:]  # the k-th score
    finite = summed > float("-inf")
    above = (summed > cut) & finite
    at_cut = (summed == cut) & finite
    room = k - above.sum(-1, keepdim=True)  # places left for the ties at the cut, taken earliest first
    chosen = above | at_cut & (at_cut.cumsum(-1) <= room)
    order = torch.arange(n, 0, -1, device=summed.device)  # the chosen in chunk order, then the rest (0)
    picked, index = torch.topk(chosen * order, k, -1)
    valid = picked > 0
    return chosen, torch.where(valid, index, 0), valid


def _spread(choice: tuple[Tensor, Tensor, Tensor], group: int) -> tuple[Tensor, Tensor, Tensor]:
    """A group's choice given to each of its heads."""
    return choice if group == 1 else tuple(None if x is None else x.repeat_interleave(group, 2) for x in choice)


def gather(sources: tuple[tuple[Tensor, ...], ...], index: Tensor, c: int) -> tuple[Tensor, ...]:
    """The rows of the chosen chunks from each source (the keys, the values): a source is the summarised chunks'
    rows in order as parts (B or 1, H, N_p, D) (chunk m at rows m·c … m·c + c − 1 of their concatenation: a fork's
    parent's rows, then its own), index (B, G, H, R, k) -> one (B, G, H, R, k·c, D) a source.

    Each part is read where its rows are chosen, never concatenated: a fork scoring a test item would copy every
    cached row otherwise. Over several parts (a long cache's pages, evalm/cache.py `Rows`) each part gives only
    the rows that lie in it, found once for every source: the cost is the k·c rows a query reads, not that times
    the number of pages."""
    B, G, H, R, k = index.shape
    rows = (index.unsqueeze(-1) * c + torch.arange(c, device=index.device)).flatten(-2)  # (B, G, H, R, k·c)
    heads = torch.arange(H, device=index.device).view(1, 1, H, 1, 1)
    if len(sources[0]) == 1:
        batch = torch.arange(B, device=index.device).view(B, 1, 1, 1, 1)
        return tuple(part[batch if part.shape[0] > 1 else 0, heads, rows] for (part,) in sources)
    outs = tuple(parts[0].new_zeros(*rows.shape, parts[0].shape[-1]) for parts in sources)
    start = 0
    for parts in zip(*sources):
        n = parts[0].shape[-2]
        at = ((rows >= start) & (rows < start + n)).nonzero(as_tuple=True)  # (b, g, h, r, j) of the rows it holds
        local = rows[at] - start
        for out, part in zip(outs, parts):
            out[at] = part[at[0] if part.shape[0] > 1 else 0, at[2], local]
        start += n
    return outs


def key_bounds(k: Tensor, c: int) -> Tensor:
    """Quest's per-chunk key bounds (Tang et al. 2024, §3.3): k (B, H, n·c, D), whole chunks -> (B, H, 2n, D),
    chunk m's per-channel minimum at row 2m and maximum at row 2m + 1 (2·D numbers a chunk, kept beside its
    c·D keys: 2/c more rows)."""
    B, H, N, D = k.shape
    chunks = k.reshape(B, H, N // c, c, D)
    return torch.stack([chunks.amin(3), chunks.amax(3)], 3).reshape(B, H, 2 * (N // c), D)


def bound_scores(q: Tensor, bounds: tuple[Tensor, ...], n: int) -> Tensor:
    """The bound ranking (`select_by = "bound"`): q (B, G, H, R, D), scaled, and the chunks' `key_bounds` as parts
    (B or 1, H, 2·n_p, D) -> (B, G, H, R, n) for the first n chunks. Σ_d max(q_d·min_d, q_d·max_d) = q⁺·max + q⁻·min
    is at least every logit q·k_j of the chunk's tokens, so the chunk holding the query's best key is never
    ranked below it (a mean key, the summary's, can average that key away)."""
    pos, neg = q.detach().clamp(min=0), q.detach().clamp(max=0)  # the choice carries no gradient
    out = []
    for part in bounds:
        low, high = (x.unsqueeze(1).transpose(-1, -2) for x in part.unflatten(-2, (-1, 2)).unbind(-2))
        out.append(torch.matmul(pos, high.to(q.dtype)) + torch.matmul(neg, low.to(q.dtype)))
    return torch.cat(out, -1)[..., :n] if out else q.new_zeros(*q.shape[:-1], 0)


def token_ids(index: Tensor, first_chunk: int, c: int) -> Tensor:
    """The chosen tokens' positions (B, G, H, R, k·c): their keys in the dropout mask (evalm/dropout_mask.py),
    which names a token key by its position wherever it is read."""
    return ((first_chunk + index).unsqueeze(-1) * c + torch.arange(c, device=index.device)).flatten(-2)
