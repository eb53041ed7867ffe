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
  selection  a group whose queries also read their chosen chunks' tokens: evalm/tile_selection.py
The call and its key sets are the types of evalm/tile_call.py.

Legend: B sequences, H heads, D head dimension, T new tokens, w window (block), c chunk, ext 0 or w;
seq_k/v (B, H, n_seen − first_row + T, D) the cached window rows, then the new ones, first_row
= max(0, ⌊n_seen/w⌋·w − ext) the absolute position of the first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from evalm import dropout_mask, tile_selection
from evalm.cache import parts_head, parts_len
from evalm.eva_paths import Route
from evalm.heads import upcast
from evalm.joint_softmax import joint_softmax
from evalm.tile_call import KeySets, TiledCall, TileGroup, TilePlan, dropout_keys
from evalm.tiling import Tiling

TILE_LOGITS = 1 << 24  # logits per query tile group (B·H·rows·keys): bounds memory on long segments


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
        return tile_selection.attend(call, g, sets).transpose(1, 2)
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
    row_keys, key_keys = dropout_keys(call, g, sets, summaries=True)
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
