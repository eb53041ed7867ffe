"""A cached EVA call as its tiles see it: what they read (`Entries`), their grid (`TilePlan`), the call
(`TiledCall`), a group of tiles (`TileGroup`) and its key sets (`KeySets`), and what every reader of those sets
shares: their logits and values, and their attention dropout keys (evalm/tiles.py, evalm/tile_selection.py).

Legend: as evalm/tiles.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor, nn

from evalm import dropout_mask
from evalm.cache import Parts
from evalm.eva_paths import EvaPath
from evalm.tiling import Tiling


class Entries(NamedTuple):
    """What every tile of a cached call may read besides its local rows."""

    remote_k: Parts  # parts (B or 1, H, C_i, D): k̃ of the completed chunks, in order
    remote_v: Parts  # parts (B or 1, H, C_i, D): β
    prefix: tuple[Tensor, Tensor] | None  # entries merged from other caches: all visible, no bias
    own_bias: float  # added to this cache's own logits (merged prompts weigh their parts)
    sink: tuple[Tensor, Tensor] | None = None  # (B or 1, H, ≤ S, D) keys, values of the sink tokens
    tokens: tuple[Parts, Parts] | None = None  # parts (B or 1, H, N_p, D): the summarised chunks' own keys and
    # values, in chunk order (selection reads them, evalm/selection.py; None without selection)
    bounds: Parts | None = None  # parts (B or 1, H, 2 per chunk, D): the chunks' key bounds (select_by "bound", "window-bound")


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


def set_logits(q: Tensor, k: Tensor) -> Tensor:
    """q (B, G, H, rows, D) times a key set (B, G, H, K, D) -> (B, G, H, rows, K); a set shared by every
    sequence and tile (stride 0 there: the summaries) is read once, the rows folded over it."""
    B, G, H, rows, D = q.shape
    if _shared(k) and B * G > 1:
        folded = q.permute(2, 0, 1, 3, 4).reshape(H, B * G * rows, D)
        return torch.matmul(folded, k[0, 0].transpose(-1, -2)).view(H, B, G, rows, -1).permute(1, 2, 0, 3, 4)
    return torch.matmul(q, k.transpose(-1, -2))


def set_values(p: Tensor, v: Tensor) -> Tensor:
    """Probabilities (B, G, H, rows, K) times a value set (B, G, H, K, D) -> (B, G, H, rows, D)."""
    B, G, H, rows, K = p.shape
    if _shared(v) and B * G > 1:
        folded = p.permute(2, 0, 1, 3, 4).reshape(H, B * G * rows, K)
        return torch.matmul(folded, v[0, 0]).view(H, B, G, rows, -1).permute(1, 2, 0, 3, 4)
    return torch.matmul(p, v)


def _shared(x: Tensor) -> bool:
    return (x.shape[0] == 1 or x.stride(0) == 0) and (x.shape[1] == 1 or x.stride(1) == 0)


def dropout_keys(call: TiledCall, g: TileGroup, sets: KeySets, summaries: bool) -> tuple[Tensor, Tensor]:
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
