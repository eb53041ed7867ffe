"""EVA over a cache's entries: the paths "tiles" and "forks", and their split-softmax forms
(evalm/eva_paths.py chooses; `EvaAttention` keeps the cache, evalm/eva.py).

New queries at n_seen … n_seen + T − 1 attend to their window, the sink tokens and chunk summaries
they may see and any prefix merged from other caches, in one softmax (docs/eva.md, "The closed form"):
  a tile     `rows` queries on a block-aligned grid from ⌊n_seen/w⌋·w, with the ext + rows keys that
             end with it; G tiles of a group share one mask and one read of the remote entries
  one group  `F.scaled_dot_product_attention` over the concatenated key sets with an additive
             mask; with attention dropout the same softmax written out, times the hashed keep
             mask of evalm/dropout_mask.py (the mask every path draws); without a graph and with
             one tile per group, the split softmax (evalm/joint_softmax.py)
  forks      a batch of forks scoring short inputs over one shared parent, their rows folded into
             one query block, so the parent's entries are read once

Legend: B sequences, H heads, D head dimension, T new tokens, w window (block), c chunk, ext 0 or w;
seq_k/v (B, H, n_seen − first_row + T, D) the cached window rows, then the new ones, first_row
= max(0, ⌊n_seen/w⌋·w − ext) the absolute position of the first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from evalm import dropout_mask, selection
from evalm.cache import Parts, parts_head, parts_len
from evalm.eva_paths import EvaPath, Route
from evalm.heads import upcast
from evalm.joint_softmax import joint_softmax
from evalm.tiling import Tiling

TILE_LOGITS = 1 << 24  # logits per query tile group (B·H·rows·keys): bounds memory on long segments


class Entries(NamedTuple):
    """What every tile of a cached call may read besides its local rows."""

    remote_k: Parts  # parts (B or 1, H, C_i, D): k̃ of the completed chunks, in order
    remote_v: Parts  # parts (B or 1, H, C_i, D): β
    prefix: tuple[Tensor, Tensor] | None  # entries merged from other caches: all visible, no bias
    own_bias: float  # added to this cache's own logits (merged prompts weigh their parts)
    sink: tuple[Tensor, Tensor] | None = None  # (B or 1, H, ≤ S, D) keys, values of the sink tokens
    tokens: tuple[Parts, Parts] | None = None  # parts (B or 1, H, N_p, D): the summarised chunks' own keys and
    # values, in chunk order (selection reads them, evalm/selection.py; None without selection)
    bounds: Parts | None = None  # parts (B or 1, H, 2 per chunk, D): the chunks' key bounds (select_by "bound")


class TilePlan(NamedTuple):
    """The query grid of a cached call."""

    grid_start: int  # ⌊n_seen/w⌋·w: tiles are block-aligned
    lead: int  # n_seen − grid_start dummy rows before the first query
    rows: int  # queries per tile
    n_tiles: int
    group: int  # tiles per group (one mask and one read of the remote entries each)

    @property
    def n_seen(self) -> int:
        return self.grid_start + self.lead


def plan(t: Tiling, query_tile: int, batch_heads: int, n_seen: int, T: int, n_extra: int) -> TilePlan:
    """Tiles of at most `query_tile` rows from the block holding n_seen; groups within TILE_LOGITS
    (`n_extra`: the remote and prefix entries a tile may read)."""
    w = t.window
    grid_start = n_seen // w * w
    lead = n_seen - grid_start
    rows = min(query_tile, -(-(lead + T) // w) * w)  # a short segment gets a short tile
    n_tiles = -(-(lead + T) // rows)
    per_tile = batch_heads * rows * (t.ext + rows + n_extra)
    return TilePlan(grid_start, lead, rows, n_tiles, max(1, min(n_tiles, TILE_LOGITS // per_tile)))


@dataclass(frozen=True)
class TiledCall:
    """One cached call of an EVA layer: everything its tiles read besides their rows."""

    t: Tiling  # the rule, the scale, attention dropout's rate and seed
    plan: TilePlan
    path: EvaPath  # its route (tiles or forks) and whether it splits the softmax
    entries: Entries
    bias: nn.Module | None  # the layer's T5 bias of key distances (unscaled), or None
    sink_shift: Callable[[Tensor, Tensor], Tensor] | None = None  # moves sink keys by a position shift (EvaAttention)
    select_shift: Callable[[Tensor, Tensor], Tensor] | None = None  # moves selected tokens' keys the same way


class TileGroup(NamedTuple):
    """G tiles of queries with their local keys, and where each row and key sits."""

    q: Tensor  # (B, H, G, rows, D)
    k: Tensor  # (B, H, G, D, L) local keys
    v: Tensor  # (B, H, G, D, L) local values
    q_pos: Tensor  # (G, rows, 1) absolute positions of the queries
    k_pos: Tensor  # (G, 1, L) absolute positions of the local keys
    seq: Tensor  # each query row's sequence, broadcast to (B, G, 1, rows): the dropout mask's index
    same_sequence: Tensor | None = None  # (rows, L): keeps each folded row on its own sequence's keys


class KeySets(NamedTuple):
    """A group's key sets: its local rows, its sink tokens, the chunks its queries may see, any merged prefix."""

    masks: list[Tensor]  # additive (G, rows, K_p)
    keys: list[Tensor]  # (B, G, H, K_p, D)
    values: list[Tensor]
    n_vis: int  # chunks visible to some query of the group (chunks first_chunk … first_chunk + n_vis − 1)
    sink_ids: Tensor | None = None  # each sink column's token position (moved copies repeat them)
    remote: slice = slice(0, 0)  # the sets that hold the summaries
    candidates: Tensor | None = None  # (G, rows, 1) summaries each query may select (`Tiling.candidate_count`)


def attend(call: TiledCall, q: Tensor, seq_k: Tensor, seq_v: Tensor) -> Tensor:
    """Queries q (B, H, T, D) at n_seen … n_seen+T−1 over their window, the visible chunks and any
    merged prefix -> (B, H, T, D).

    Queries lie on the plan's grid (dummy rows pad the first and last tile and are dropped);
    tile j's local keys are the ext + rows positions that end with it, so one unfold gives
    every tile its keys and autograd sees one view, not one slice per tile.
    """
    B, H, T, D = q.shape
    p, ext = call.plan, call.t.ext
    rows, lead, n_tiles, n_seen = p.rows, p.lead, p.n_tiles, p.n_seen
    q_grid = F.pad(q, (0, 0, lead, n_tiles * rows - lead - T)).unflatten(-2, (n_tiles, rows))
    key_pad = (max(0, p.grid_start - ext) - (p.grid_start - ext), p.grid_start + n_tiles * rows - (n_seen + T))
    k_grid = F.pad(seq_k, (0, 0, *key_pad)).unfold(-2, ext + rows, rows)  # (B, H, n_tiles, D, ext + rows)
    v_grid = F.pad(seq_v, (0, 0, *key_pad)).unfold(-2, ext + rows, rows)
    arange = torch.arange(max(ext + rows, T), device=q.device)
    seq = torch.arange(B, device=q.device).view(B, 1, 1, 1)
    if n_tiles == 1:  # a short segment (a test input): its real rows only, no dummy queries
        k_pos = (p.grid_start - ext + arange[: ext + lead + T]).view(1, 1, -1)
        q_pos = (n_seen + arange[:T]).view(1, T, 1)
        local = slice(0, ext + lead + T)  # the single tile's local keys, without the trailing pad
        if call.path.route is Route.FORKS:
            return _attend_folded(call, q, k_grid[..., local], v_grid[..., local], q_pos, k_pos)
        group = TileGroup(q.unsqueeze(2), k_grid[..., local], v_grid[..., local], q_pos, k_pos, seq)
        return _attend_group(call, group).squeeze(2)
    starts = p.grid_start + torch.arange(n_tiles, device=q.device) * rows
    outs = []
    for q_tiles, k_tiles, v_tiles, start in zip(*(x.split(p.group, 2) for x in (q_grid, k_grid, v_grid)),
                                                starts.split(p.group)):
        q_pos = start[:, None, None] + arange[:rows, None]  # (G, rows, 1)
        k_pos = start[:, None, None] - ext + arange[: ext + rows]  # (G, 1, ext + rows)
        outs.append(_attend_group(call, TileGroup(q_tiles, k_tiles, v_tiles, q_pos, k_pos, seq)))
    return torch.cat(outs, 2).flatten(2, 3)[..., lead : lead + T, :]


def _attend_folded(call: TiledCall, q: Tensor, k_local: Tensor, v_local: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """A batch of forks scoring short inputs over one shared parent: q (B, H, T, D), local keys
    and values (B, H, 1, D, L).

    The B sequences' rows are folded into one query block, so the parent's remote entries
    (thousands of chunk summaries after many demonstrations) are read once instead of being
    copied per candidate; a sequence mask keeps each row on its own local keys.
    """
    B, H, T, D = q.shape
    L = k_local.shape[-1]
    k_folded, v_folded = (x.permute(2, 1, 3, 0, 4).reshape(1, H, 1, D, B * L) for x in (k_local, v_local))
    row_sequence = torch.arange(B, device=q.device).repeat_interleave(T)
    key_sequence = torch.arange(B, device=q.device).repeat_interleave(L)
    group = TileGroup(q.transpose(0, 1).reshape(1, H, 1, B * T, D), k_folded, v_folded, q_pos.repeat(1, B, 1),
                      k_pos.repeat(1, 1, B), row_sequence.view(1, 1, 1, -1),
                      same_sequence=row_sequence[:, None] == key_sequence[None, :])
    return _attend_group(call, group).view(H, B, T, D).transpose(0, 1)


def _attend_group(call: TiledCall, g: TileGroup) -> Tensor:
    """G tiles -> (B, H, G, rows, D)."""
    B, H, G, rows, D = g.q.shape
    sets = _key_sets(call, g)
    if call.t.select:
        return _attend_selecting(call, g, sets).transpose(1, 2)
    if call.path.split:  # one tile, no graph: each key set softmaxed apart (evalm/joint_softmax.py)
        return joint_softmax(g.q[:, :, 0] * call.t.scale, sets.keys, sets.values, sets.masks).unsqueeze(2)
    mask = torch.cat(sets.masks, -1).unsqueeze(1)  # (G, 1, rows, K): broadcast over heads
    keys, values = torch.cat(sets.keys, -2), torch.cat(sets.values, -2)  # (B, G, H, K, D)
    if call.t.dropout > 0:
        return _attend_dropped(call, g, sets, (keys, values, mask)).transpose(1, 2)
    n_keys = mask.shape[-1]
    if B > 1:
        mask = mask.expand(B, -1, -1, -1, -1).reshape(B * G, 1, rows, n_keys)
    out = F.scaled_dot_product_attention(g.q.transpose(1, 2).reshape(B * G, H, rows, D), keys.reshape(B * G, H, n_keys, D),
                                         values.reshape(B * G, H, n_keys, D), attn_mask=mask, scale=call.t.scale)
    return out.view(B, G, H, rows, D).transpose(1, 2)


def _attend_dropped(call: TiledCall, g: TileGroup, sets: KeySets, joined: tuple[Tensor, Tensor, Tensor]) -> Tensor:
    """The group's attention with attention dropout on the joint probabilities: softmax (in at least
    fp32), times the keep mask of (seed, sequence, head, query position, key id) scaled by 1/(1 − p)
    (evalm/dropout_mask.py), times the values -> (B, G, H, rows, D). Key ids: a token's position
    (local or sink), −1 − r for chunk r, `dropout_mask.prefix_key(m)` for the m-th merged prefix entry."""
    keys, values, mask = joined
    t = call.t
    logits = upcast(torch.matmul(g.q.transpose(1, 2) * t.scale, keys.transpose(-1, -2))).add_(mask)
    probs = torch.softmax(logits, -1)
    row_keys, key_keys = _dropout_keys(call, g, sets, summaries=True)
    keep = dropout_mask.keep_of(row_keys.unsqueeze(-1), key_keys, t.dropout).to(probs.dtype).mul_(dropout_mask.scale(t.dropout))
    return torch.matmul((probs * keep).to(values.dtype), values)  # not in place: softmax's backward reads probs


def _key_sets(call: TiledCall, g: TileGroup) -> KeySets:
    """Additive masks, keys and values of a group's key sets: its local rows, the sink tokens and
    the chunks its queries may see (in order, as their key ids), any merged prefix."""
    B, H, G = g.k.shape[:3]
    t, entries, dtype = call.t, call.entries, g.q.dtype
    window_start = t.window_start(g.q_pos)  # (G, rows, 1)
    local = torch.full((G, g.q_pos.shape[1], g.k_pos.shape[-1]), entries.own_bias, dtype=dtype, device=g.q_pos.device)
    if call.bias is not None:
        local = local + t.scale * call.bias((g.q_pos - g.k_pos).clamp(min=0)).to(dtype)
    visible = (g.k_pos <= g.q_pos) & (g.k_pos >= window_start)
    if g.same_sequence is not None:
        visible = visible & g.same_sequence
    masks = [local.masked_fill(~visible, float("-inf"))]
    keys, values = [g.k.permute(0, 2, 1, 4, 3)], [g.v.permute(0, 2, 1, 4, 3)]  # (B, G, H, L, D)

    sink_ids = None
    if entries.sink is not None:  # sink tokens j < sink_count are visible; later ones are local keys
        count = t.sink_count(g.q_pos)  # (G, rows, 1)
        n_sink = min(int(count.max()), entries.sink[0].shape[-2])
        if n_sink > 0:
            sink_k, sink_v = (x[..., :n_sink, :].unsqueeze(1) for x in entries.sink)  # (B or 1, 1, H, n_sink, D)
            sink_ids = torch.arange(n_sink, device=g.q_pos.device)
            hidden = sink_ids >= count  # (G, rows, n_sink)
            if call.sink_shift is not None:
                sink_k, sink_v, sink_ids, hidden = _moved_sink(call, g, sink_k, sink_v, hidden)
            keys.append(sink_k.expand(B, G, -1, -1, -1))
            values.append(sink_v.expand(B, G, -1, -1, -1))
            masks.append(torch.full(hidden.shape, entries.own_bias, dtype=dtype, device=g.q_pos.device).masked_fill(hidden, float("-inf")))

    limit = t.remote_count(g.q_pos)  # (G, rows, 1): the first `limit` summaries are visible
    n_vis = min(int(limit.max()), parts_len(entries.remote_k))
    first_remote = len(keys)
    if n_vis > 0:
        keys.extend(p.unsqueeze(1).expand(B, G, -1, -1, -1) for p in parts_head(entries.remote_k, n_vis))
        values.extend(p.unsqueeze(1).expand(B, G, -1, -1, -1) for p in parts_head(entries.remote_v, n_vis))
        hidden = torch.arange(n_vis, device=g.q_pos.device) >= limit  # (G, rows, n_vis)
        masks.append(torch.full(hidden.shape, entries.own_bias, dtype=dtype, device=g.q_pos.device).masked_fill(hidden, float("-inf")))
    remote = slice(first_remote, len(keys))
    if entries.prefix is not None:
        prefix_k, prefix_v = entries.prefix
        keys.append(prefix_k.unsqueeze(1).expand(B, G, -1, -1, -1))
        values.append(prefix_v.unsqueeze(1).expand(B, G, -1, -1, -1))
        masks.append(torch.zeros(G, g.q_pos.shape[1], prefix_k.shape[-2], dtype=dtype, device=g.q_pos.device))
    candidates = t.candidate_count(g.q_pos).clamp(max=n_vis) if t.select else None
    return KeySets(masks, keys, values, n_vis, sink_ids, remote, candidates)


def _set_logits(q: Tensor, k: Tensor) -> Tensor:
    """q (B, G, H, rows, D) times a key set (B, G, H, K, D) -> (B, G, H, rows, K); a set shared by every
    sequence and tile (stride 0 there: the summaries) is read once, the rows folded over it."""
    B, G, H, rows, D = q.shape
    if _shared(k) and B * G > 1:
        folded = q.permute(2, 0, 1, 3, 4).reshape(H, B * G * rows, D)
        return torch.matmul(folded, k[0, 0].transpose(-1, -2)).view(H, B, G, rows, -1).permute(1, 2, 0, 3, 4)
    return torch.matmul(q, k.transpose(-1, -2))


def _set_values(p: Tensor, v: Tensor) -> Tensor:
    """Probabilities (B, G, H, rows, K) times a value set (B, G, H, K, D) -> (B, G, H, rows, D)."""
    B, G, H, rows, K = p.shape
    if _shared(v) and B * G > 1:
        folded = p.permute(2, 0, 1, 3, 4).reshape(H, B * G * rows, K)
        return torch.matmul(folded, v[0, 0]).view(H, B, G, rows, -1).permute(1, 2, 0, 3, 4)
    return torch.matmul(p, v)


def _shared(x: Tensor) -> bool:
    return (x.shape[0] == 1 or x.stride(0) == 0) and (x.shape[1] == 1 or x.stride(1) == 0)


def _attend_selecting(call: TiledCall, g: TileGroup, sets: KeySets) -> Tensor:
    """The group's attention with selection (evalm/selection.py) -> (B, G, H, rows, D): the summaries'
    logits choose each query's chunks, whose tokens join its keys and whose summaries leave the softmax (with
    `select_only` every summary leaves); one softmax in at least fp32, attention dropout as in
    `_attend_dropped` (a selected token's key id is its position)."""
    t, entries = call.t, call.entries
    B, H, G, rows, D = g.q.shape
    q = g.q.transpose(1, 2) * t.scale  # (B, G, H, rows, D)
    masks = torch.cat(sets.masks, -1).split([k.shape[-2] for k in sets.keys], -1)  # one mask may span several parts
    logits = [upcast(_set_logits(q, k)).add_(m.unsqueeze(1)) for k, m in zip(sets.keys, masks)]
    values = list(sets.values)
    remote = torch.cat(logits[sets.remote], -1) if sets.n_vis else logits[0].new_zeros(B, G, H, rows, 0)
    candidate = torch.arange(sets.n_vis, device=q.device) < sets.candidates  # (G, rows, n_vis)
    scores = remote
    if t.select_by == "bound":  # Quest's bound ranks the same candidates (evalm/selection.py)
        bound = selection.bound_scores(q, entries.bounds or (), sets.n_vis)
        scores = torch.where(remote > float("-inf"), upcast(bound), float("-inf"))
    chosen, index, valid = selection.choose(scores.masked_fill(~candidate.unsqueeze(1), float("-inf")), t.select,
                                            t.select_group)
    kept = slice(sets.remote.start, sets.remote.start) if t.select_only else sets.remote
    if not t.select_only and sets.n_vis:  # the chosen summaries leave: their tokens carry the mass now
        parts = remote.masked_fill(chosen, float("-inf")).split([k.shape[-2] for k in sets.keys[sets.remote]], -1)
        logits[sets.remote] = parts
    logits = logits[: sets.remote.start] + logits[kept] + logits[sets.remote.stop :]
    values = values[: sets.remote.start] + values[kept] + values[sets.remote.stop :]
    if index.shape[-1]:
        if call.select_shift is None:
            reader, (picked_k, picked_v) = q, selection.gather(entries.tokens, index, t.chunk)
        else:  # to the k·c positions right before the query's window, in chunk order
            (picked_v,) = selection.gather(entries.tokens[1:], index, t.chunk)
            reader, picked_k = _moved_picks(call, g, q, index)
        hidden = ~valid.repeat_interleave(t.chunk, -1)
        picked = upcast((reader.unsqueeze(-2) * picked_k).sum(-1)).add_(entries.own_bias).masked_fill_(hidden, float("-inf"))
        logits.append(picked)
    probs = torch.softmax(torch.cat(logits, -1), -1)
    if t.dropout > 0:
        probs = probs * _selection_keep(call, g, sets, index).to(probs.dtype) * dropout_mask.scale(t.dropout)
    out = None
    for p, v in zip(probs.split([x.shape[-1] for x in logits], -1), values + [None]):
        if v is None:  # the selected tokens: one set per query row
            part = (p.unsqueeze(-2).to(picked_v.dtype) @ picked_v).squeeze(-2)
        else:
            part = _set_values(p.to(v.dtype), v)
        out = part if out is None else out + part
    return out


def _moved_picks(call: TiledCall, g: TileGroup, q: Tensor, index: Tensor) -> tuple[Tensor, Tensor]:
    """The chosen tokens moved before each query's window (`selected_positions = "window"`) -> the query that
    reads them (B, G, H, rows, D) and their keys (B, G, H, rows, k·c, D).

    Token j of chunk M (at M·c + j), read in slot a (a-th chosen, in chunk order) by the query at i, sits at
    ws(i) − K·c + a·c + j (K = select_chunks, ws(i) its window's start): a move by ws(i) + (a − K − M)·c. RoPE's
    move is a rotation per position, R(x + y) = R(x)·R(y) and q·R(x)k = R(−x)q·k, so the query turned back by
    ws(i) reads keys turned by (a − K − M)·c. Those turns are made where they are fewer: on the gathered keys
    (k·c a query: a short call over a long cache, a test item after thousands of demonstrations) or on every
    cached token once a slot (k a token: a whole sequence, where every token is also a query): a rotation
    depends only on its key and its shift, so the order does not change what is read."""
    t = call.t
    B, G, H, rows = q.shape[:4]
    reader = call.select_shift(q, -t.window_start(g.q_pos).view(G, 1, rows))
    parts = call.entries.tokens[0]
    if B * G * rows * t.chunk <= parts_len(parts) * max(p.shape[0] for p in parts):
        (picked,) = selection.gather((parts,), index, t.chunk)
        slot = torch.arange(index.shape[-1], device=q.device)
        shift = ((slot - t.select - t.first_chunk - index) * t.chunk).repeat_interleave(t.chunk, -1)
        return reader, call.select_shift(picked, shift)
    starts = [0]
    for part in parts:
        starts.append(starts[-1] + part.shape[-2])
    chunks = [t.first_chunk + (s + torch.arange(p.shape[-2], device=q.device)) // t.chunk for p, s in zip(parts, starts)]
    picks = []
    for a in range(index.shape[-1]):
        moved = tuple(call.select_shift(p, (a - t.select - m) * t.chunk) for p, m in zip(parts, chunks))
        picks.append(selection.gather((moved,), index[..., a : a + 1], t.chunk)[0])
    return reader, torch.cat(picks, -2)


def _dropout_keys(call: TiledCall, g: TileGroup, sets: KeySets, summaries: bool) -> tuple[Tensor, Tensor]:
    """The hashed dropout keys of a group's rows (B, G, H, rows) and of the key sets every row shares (1, G, 1,
    1, K), in the sets' order: local and sink tokens by position, chunk r as −1 − r (where `summaries` enter the
    softmax), the m-th merged prefix entry as `dropout_mask.prefix_key(m)` (evalm/dropout_mask.py)."""
    t, device = call.t, g.q.device
    G, rows = g.q.shape[2:4]
    ids = [g.k_pos.squeeze(1)]
    if sets.sink_ids is not None:  # sink tokens by position, after the local keys
        ids.append(sets.sink_ids.expand(G, -1))
    if summaries and sets.n_vis:
        ids.append(dropout_mask.chunk_key(t.first_chunk + torch.arange(sets.n_vis, device=device)).expand(G, -1))
    if call.entries.prefix is not None:
        ids.append(dropout_mask.prefix_key(torch.arange(call.entries.prefix[0].shape[-2], device=device)).expand(G, -1))
    heads = torch.arange(g.q.shape[1], device=device).view(1, 1, -1, 1)
    row_keys = dropout_mask.row_keys(t.seed, g.seq, heads, g.q_pos.view(1, G, 1, rows))
    return row_keys, dropout_mask.key_keys(torch.cat(ids, -1)).view(1, G, 1, 1, -1)


def _selection_keep(call: TiledCall, g: TileGroup, sets: KeySets, index: Tensor) -> Tensor:
    """Attention dropout's keep decisions over the keys `_attend_selecting` reads, in its order: the shared sets
    (`_dropout_keys`, the summaries only where they stay), then the selected tokens by position -> (B, G, H,
    rows, K)."""
    t = call.t
    B, H, G, rows, _ = g.q.shape
    row_keys, shared = _dropout_keys(call, g, sets, summaries=not t.select_only)
    picked = dropout_mask.key_keys(selection.token_ids(index, t.first_chunk, t.chunk))
    keys = torch.cat([shared.expand(B, G, H, rows, -1), picked], -1)
    return dropout_mask.keep_of(row_keys.unsqueeze(-1), keys, t.dropout)


def _moved_sink(call: TiledCall, g: TileGroup, sink_k: Tensor, sink_v: Tensor, hidden: Tensor) -> tuple[Tensor, ...]:
    """The sink keys each block of the group's tiles reads, moved to sit right before that block's
    window (StreamingLLM's positions inside its cache, Xiao et al. 2024, §3.2): sink token j at
    window_start(block start) − S + j, so its distance from a query is that query's offset in its
    window plus S − j, at any absolute position (k·c further back when the selected tokens are moved there,
    `selected_positions`). One moved copy per block of a tile; a row sees its
    block's copy only. sink_k, sink_v (B or 1, 1, H, n, D), hidden (G, rows, n) -> keys and values
    (B or 1, G, H, nb·n, D), their token ids (nb·n,) and hidden (G, rows, nb·n)."""
    t, n = call.t, sink_k.shape[-2]
    block = g.q_pos // t.window  # (G, rows, 1)
    copy = block - block[:, :1]  # the row's block within its tile
    nb = int(copy.max()) + 1
    starts = (block[:, 0] + torch.arange(nb, device=block.device)) * t.window  # (G, nb) block starts
    behind = t.select * t.chunk if call.select_shift is not None else 0  # moved selected tokens sit between
    shift = (t.window_start(starts) - t.sink - behind).view(1, -1, 1, nb, 1)  # (1, G, 1, nb, 1): over heads and rows
    keys = call.sink_shift(sink_k.unsqueeze(3), shift).flatten(3, 4)  # (B or 1, G, H, nb·n, D)
    values = sink_v.unsqueeze(3).expand(-1, -1, -1, nb, -1, -1).flatten(3, 4)
    column_copy = torch.arange(nb, device=block.device).repeat_interleave(n)  # (nb·n,)
    hidden = hidden.repeat(1, 1, nb) | (column_copy != copy)
    return keys, values, torch.arange(n, device=block.device).repeat(nb), hidden
