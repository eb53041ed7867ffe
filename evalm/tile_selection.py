"""Selection on the tiles (evalm/selection.py chooses and gathers; docs/eva.md, "Selection"): a tile group's
attention where each query also reads the tokens of the chunks its summaries (or Quest's bound) rank highest, in
place of those summaries.

Written out (under a graph, with attention dropout): one softmax over every key set and the chosen tokens, in at
least fp32. On the kernel path (`EvaPath.kernel`: no graph, no dropout, a CPU) the shared key sets (the window,
the sink, a merged prefix: one mask for every head) go to PyTorch's fused CPU kernel, which returns their
log-sum-exp (evalm/flash.py `attend`), and the kept summaries and chosen tokens join it by log-sum-exp, as the
fused whole-sequence path joins its parts.

Legend: as evalm/tiles.py; k the chunks chosen per query (`select_chunks`), c tokens per chunk.
"""

from __future__ import annotations

import torch
from torch import Tensor

from evalm import dropout_mask, flash, selection
from evalm.cache import parts_len
from evalm.heads import upcast
from evalm.tile_call import KeySets, TiledCall, TileGroup, dropout_keys, set_logits, set_values


def attend(call: TiledCall, g: TileGroup, sets: KeySets) -> Tensor:
    """The group's attention with selection (evalm/selection.py) -> (B, G, H, rows, D): the summaries'
    logits choose each query's chunks, whose tokens join its keys and whose summaries leave the softmax (with
    `select_only` every summary leaves); one softmax in at least fp32, attention dropout as in
    `tiles._attend_dropped` (a selected token's key id is its position). On the kernel path (`EvaPath.kernel`: no
    graph, no dropout) the shared sets go to the fused kernel instead (`_joined_on_kernel`)."""
    t = call.t
    B, H, G, rows, D = g.q.shape
    q = g.q.transpose(1, 2) * t.scale  # (B, G, H, rows, D)
    masks = torch.cat(sets.masks, -1).split([k.shape[-2] for k in sets.keys], -1)  # one mask may span several parts
    remote = [upcast(set_logits(q, k)).add_(m.unsqueeze(1)) for k, m in zip(sets.keys[sets.remote], masks[sets.remote])]
    remote = torch.cat(remote, -1) if remote else q.new_zeros(B, G, H, rows, 0, dtype=upcast(q[..., :0, :0]).dtype)
    back = None if call.select_shift is None else call.select_shift(q, -t.window_start(g.q_pos).view(G, 1, rows))
    index, valid = _choice(call, sets, (q, back), remote)
    kept = [] if t.select_only or not sets.n_vis else list(  # the chosen summaries leave: no mass counted twice
        _leave(remote, index, valid).split([k.shape[-2] for k in sets.keys[sets.remote]], -1))
    picked, picked_v = _picks(call, (q, back), index, valid)
    shared = [i for i in range(len(sets.keys)) if not sets.remote.start <= i < sets.remote.stop]
    if call.path.kernel:
        return _joined_on_kernel(call, (q, sets, masks, shared), kept, (picked, picked_v))
    logits = [upcast(set_logits(q, sets.keys[i])).add_(masks[i].unsqueeze(1)) for i in shared[: sets.remote.start]]
    logits += kept + [upcast(set_logits(q, sets.keys[i])).add_(masks[i].unsqueeze(1)) for i in shared[sets.remote.start :]]
    values = list(sets.values[: sets.remote.start]) + (list(sets.values[sets.remote]) if kept else [])
    values += list(sets.values[sets.remote.stop :])
    if picked is not None:
        logits.append(picked)
    probs = torch.softmax(torch.cat(logits, -1), -1)
    if t.dropout > 0:
        probs = probs * _keep(call, g, sets, index).to(probs.dtype) * dropout_mask.scale(t.dropout)
    out = None
    for p, v in zip(probs.split([x.shape[-1] for x in logits], -1), values + [None]):
        if v is None:  # the selected tokens: one set per query row
            part = (p.unsqueeze(-2).to(picked_v.dtype) @ picked_v).squeeze(-2)
        else:
            part = set_values(p.to(v.dtype), v)
        out = part if out is None else out + part
    return out


def _leave(remote: Tensor, index: Tensor, valid: Tensor) -> Tensor:
    """`remote` (…, n_vis) with the chosen summaries' logits at −inf, in place: −inf added at each valid index
    (k a row; an invalid one adds 0, so it may share index 0 with a valid one), not a pass over n_vis."""
    return remote.scatter_add_(-1, index, torch.zeros_like(index, dtype=remote.dtype).masked_fill_(valid, float("-inf")))


def _choice(call: TiledCall, sets: KeySets, readers: tuple, remote: Tensor) -> tuple[Tensor, Tensor]:
    """`selection.choose`'s indices and `valid` over the group's candidates, ranked by their summary logits
    `remote` (B, G, H, rows, n_vis; −inf where not visible) or by Quest's bound (`select_by = "bound"` read by the
    query q; "window-bound": the bounds of keys turned back to −c … −1, read by the query turned back by its
    window's start, `back`, `EvaAttention._bound_keys`). The candidates are each row's first ones: the scores are
    cut to the most any row has (a view), and masked only where rows differ."""
    t = call.t
    q, back = readers
    most = int(sets.candidates.max()) if sets.candidates.numel() else 0
    scores = remote[..., :most]
    if t.by_bound:  # Quest's bound ranks the same candidates (evalm/selection.py)
        bound = selection.bound_scores(q if t.select_by == "bound" else back, call.entries.bounds or (), sets.n_vis)
        scores = torch.where(scores > float("-inf"), upcast(bound[..., :most]), float("-inf"))
    if bool((sets.candidates < most).any()):
        candidate = torch.arange(most, device=q.device) < sets.candidates  # (G, rows, most)
        scores = scores.masked_fill(~candidate.unsqueeze(1), float("-inf"))
    _, index, valid = selection.choose(scores, t.select, t.select_group, mask=False)
    return index, valid


def _picks(call: TiledCall, readers: tuple, index: Tensor, valid: Tensor) -> tuple[Tensor | None, Tensor | None]:
    """The chosen tokens' logits (B, G, H, rows, k·c; −inf where a query had fewer candidates than k) and values
    (B, G, H, rows, k·c, D), or (None, None) where no query has a candidate; `readers` the query q and, with the
    moved placement, the query turned back by its window's start."""
    t, entries = call.t, call.entries
    q, back = readers
    if not index.shape[-1]:
        return None, None
    if call.select_shift is None:
        reader, (picked_k, picked_v) = q, selection.gather(entries.tokens, index, t.chunk)
    else:  # to the k·c positions right before the query's window, in chunk order
        (picked_v,) = selection.gather(entries.tokens[1:], index, t.chunk)
        reader, picked_k = back, _moved_picks(call, q, index)
    hidden = ~valid.repeat_interleave(t.chunk, -1)
    picked = upcast((reader.unsqueeze(-2) * picked_k).sum(-1)).add_(entries.own_bias).masked_fill_(hidden, float("-inf"))
    return picked, picked_v


def _joined_on_kernel(call: TiledCall, shared: tuple, kept: list[Tensor], picks: tuple) -> Tensor:
    """Selection's attention with its shared key sets (window, sink, merged prefix: one mask for every head) on
    the fused CPU kernel (evalm/flash.py `attend`), which returns their output and log-sum-exp ℓ_s; the kept
    summaries' logits and the chosen tokens' logits are written out, and the parts are joined exactly as the fused
    path joins its parts: ℓ = log(e^ℓ_s + Σ e^logits), o = e^(ℓ_s − ℓ)·o_s + Σ e^(logit − ℓ)·v -> (B, G, H, rows, D).
    Every row sees one shared key at least (its own position)."""
    q, sets, masks, ids = shared
    B, G, H, rows, D = q.shape
    keys = torch.cat([sets.keys[i] for i in ids], -2)  # (B, G, H, K, D)
    values = torch.cat([sets.values[i] for i in ids], -2)
    mask = torch.cat([masks[i] for i in ids], -1)  # (G, rows, K): one per tile, every head alike
    n = keys.shape[-2]
    mask = mask.unsqueeze(1) if B == 1 else mask.expand(B, -1, -1, -1).reshape(B * G, 1, rows, n)
    out, lse = flash.attend(q.reshape(B * G, H, rows, D), keys.reshape(B * G, H, n, D), values.reshape(B * G, H, n, D),
                            mask.to(q.dtype))
    out, lse = out.view(B, G, H, rows, D), lse.view(B, G, H, rows)
    picked, picked_v = picks
    written = kept + ([picked] if picked is not None else [])
    total = torch.stack([lse] + [x.logsumexp(-1) for x in written]).logsumexp(0)  # ℓ
    out = out * (lse - total).exp().unsqueeze(-1)
    for logits, v in zip(kept, sets.values[sets.remote]):  # the kept summaries, part by part
        out = out + set_values((logits - total.unsqueeze(-1)).exp().to(v.dtype), v)
    if picked is not None:
        weights = (picked - total.unsqueeze(-1)).exp().to(picked_v.dtype)
        out = out + (weights.unsqueeze(-2) @ picked_v).squeeze(-2)
    return out


def _moved_picks(call: TiledCall, q: Tensor, index: Tensor) -> Tensor:
    """The chosen tokens' keys moved before each query's window (`selected_positions = "window"`) -> (B, G, H,
    rows, k·c, D), read by the query turned back by its window's start (`attend`).

    Token j of chunk M (at M·c + j), read in slot a (a-th chosen, in chunk order) by the query at i, sits at
    ws(i) − K·c + a·c + j (K = select_chunks, ws(i) its window's start): a move by ws(i) + (a − K − M)·c. RoPE's
    move is a rotation per position, R(x + y) = R(x)·R(y) and q·R(x)k = R(−x)q·k, so the query turned back by
    ws(i) reads keys turned by (a − K − M)·c. Those turns are made where they are fewer: on the gathered keys
    (k·c a query: a short call over a long cache, a test item after thousands of demonstrations) or on every
    cached token once a slot (k a token: a whole sequence, where every token is also a query): a rotation
    depends only on its key and its shift, so the order does not change what is read."""
    t = call.t
    B, G, H, rows = q.shape[:4]
    parts = call.entries.tokens[0]
    if B * G * rows * t.chunk <= parts_len(parts) * max(p.shape[0] for p in parts):
        (picked,) = selection.gather((parts,), index, t.chunk)
        slot = torch.arange(index.shape[-1], device=q.device)
        shift = ((slot - t.select - t.first_chunk - index) * t.chunk).repeat_interleave(t.chunk, -1)
        return call.select_shift(picked, shift)
    starts = [0]
    for part in parts:
        starts.append(starts[-1] + part.shape[-2])
    chunks = [t.first_chunk + (s + torch.arange(p.shape[-2], device=q.device)) // t.chunk for p, s in zip(parts, starts)]
    picks = []
    for a in range(index.shape[-1]):
        moved = tuple(call.select_shift(p, (a - t.select - m) * t.chunk) for p, m in zip(parts, chunks))
        picks.append(selection.gather((moved,), index[..., a : a + 1], t.chunk)[0])
    return torch.cat(picks, -2)


def _keep(call: TiledCall, g: TileGroup, sets: KeySets, index: Tensor) -> Tensor:
    """Attention dropout's keep decisions over the keys `attend` reads, in its order: the shared sets
    (`dropout_keys`, the summaries only where they stay), then the selected tokens by position -> (B, G, H,
    rows, K)."""
    t = call.t
    B, H, G, rows, _ = g.q.shape
    row_keys, shared = dropout_keys(call, g, sets, summaries=not t.select_only)
    picked = dropout_mask.key_keys(selection.token_ids(index, t.first_chunk, t.chunk))
    keys = torch.cat([shared.expand(B, G, H, rows, -1), picked], -1)
    return dropout_mask.keep_of(row_keys.unsqueeze(-1), keys, t.dropout)
