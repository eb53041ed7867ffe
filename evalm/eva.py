"""Causal EVA attention: block-local softmax attention plus one compressed pseudo-token per
completed earlier chunk, in one softmax (docs/eva.md, "The closed form"; EVALM paper §3.1).

For the query at absolute position i (the visibility rule is `Tiling.window_start` / `Tiling.limit`):
  local keys  L(i) = { j : max(0, ⌊i/w⌋·w − ext) ≤ j ≤ i }   (a causal block, not a sliding window)
  remote keys R(i) = { chunks r : r < ⌊i/c⌋ }                 (or before the query's window, with
                                                               exclude_window_chunks)
  chunk r:    k̃_r and β_r from evalm/summaries.py
  o_i = softmax([s·q_i·k_j + t5(i, j)]_{j∈L(i)} ⧺ [s·q_i·k̃_r]_{r∈R(i)}) · [v_j ⧺ β_r]

Legend of this file:
  B sequences, H heads, D head dimension, T new tokens, w window (block), c chunk, ext 0 or w
  n_seen     tokens a cache had encoded before this call (0 without one)
  first_row  absolute position of the first cached window row, max(0, ⌊n_seen/w⌋·w − ext)
  seq_k/v    (B, H, n_seen − first_row + T, D): the cached window rows, then the new ones
  chunk_q    (B, H, ·, D) queries from the start of the incomplete chunk: its pending rows, then the new
  a tile     `rows` queries on a block-aligned grid from ⌊n_seen/w⌋·w, with the ext + rows keys that
             end with it; G tiles of a group share one mask and one read of the remote entries

`evalm/eva_paths.py` chooses the implementation a call takes and says why; this module runs it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from evalm import eva_paths, flash, summaries, tiling
from evalm.cache import Cache, Parts, parts_append, parts_bytes, parts_head, parts_len
from evalm.eva_paths import EvaCall, EvaPath
from evalm.heads import HeadProjections
from evalm.joint_softmax import joint_softmax
from evalm.whole_sequence import eva_attention
from evalm.summaries import AdaptiveMaps
from evalm.tiling import Tiling

TILE_LOGITS = 1 << 24  # logits per query tile group (B·H·rows·keys): bounds memory on long segments


def t5_bucket(distance: Tensor, num_buckets: int, max_distance: int) -> Tensor:
    """Causal T5 bucketing of non-negative distances: exact below num_buckets/2, then log-spaced."""
    max_exact = num_buckets // 2
    if max_distance <= max_exact:  # the whole span is exact (w + ext <= 8); farther keys, masked anyway, take the last
        return distance.clamp(max=num_buckets - 1)
    large = max_exact + (
        torch.log(distance.float().clamp(min=1) / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).long()
    large = large.clamp(max=num_buckets - 1)
    return torch.where(distance < max_exact, distance, large)


class T5RelativeBias(nn.Module):
    """One scalar per distance bucket, shared by all heads of a layer (the public reference's layout)."""

    def __init__(self, window_size: int, ext: int):
        super().__init__()
        span = window_size + ext
        self.num_buckets = int(max(min(span // 2, 64), 16))
        self.max_distance = span
        self.ext = ext
        self.relative_attention_bias = nn.Embedding(self.num_buckets, 1)

    def forward(self, distance: Tensor) -> Tensor:
        """Bias for key distance i − j ≥ 0; the reference buckets max(0, i − j − ext) (docs/eva.md, "T5 bias")."""
        bucket = t5_bucket((distance - self.ext).clamp(min=0), self.num_buckets, self.max_distance)
        return self.relative_attention_bias(bucket).squeeze(-1)


def _adaptive_map(head_dim: int, layer_norm: bool) -> nn.Sequential:
    """A_q / A_k: Linear(D→D) then LayerNorm(D), shared across heads ('qk' mode)."""
    layers = [nn.Linear(head_dim, head_dim)]
    if layer_norm:
        layers.append(nn.LayerNorm(head_dim))
    return nn.Sequential(*layers)


@dataclass(frozen=True)
class EvaState:
    """One EVA layer after n_seen tokens (docs/eva.md, "The cache"), a `LayerState` (evalm/cache.py). B is 1 for a
    shared parent."""

    local_k: Tensor  # (B, H, ℓ, D) window keys, positions max(0, ⌊n/w⌋·w − ext) … n−1
    local_v: Tensor  # (B, H, ℓ, D) window values
    pending_q: Tensor  # (B, H, n − ⌊n/c⌋·c, D) queries of the incomplete chunk
    remote_k: Parts = ()  # parts (B, H, C_i, D): k̃_r of completed chunks, in order
    remote_v: Parts = ()  # parts (B, H, C_i, D): β_r
    n_owned: int = 0  # trailing remote parts this cache may merge into

    def entries(self) -> tuple[Tensor, Tensor]:
        """Everything a later token may attend to: (B, H, ℓ + n_chunks, D) keys and values."""
        return (torch.cat([*self.remote_k, self.local_k], -2), torch.cat([*self.remote_v, self.local_v], -2))

    def nbytes(self) -> int:
        return parts_bytes((self.local_k, self.local_v, self.pending_q, *self.remote_k, *self.remote_v))

    def disowned(self) -> EvaState:
        return dataclasses.replace(self, n_owned=0)



class Entries(NamedTuple):
    """What every tile of a cached call may read besides its local rows."""

    remote_k: Parts  # parts (B or 1, H, C_i, D): k̃ of the completed chunks, in order
    remote_v: Parts  # parts (B or 1, H, C_i, D): β
    prefix: tuple[Tensor, Tensor] | None  # entries merged from other caches: all visible, no bias
    own_bias: float  # added to this cache's own logits (merged prompts weigh their parts)


class TilePlan(NamedTuple):
    """The query grid of a cached call."""

    grid_start: int  # ⌊n_seen/w⌋·w: tiles are block-aligned
    lead: int  # n_seen − grid_start dummy rows before the first query
    rows: int  # queries per tile
    n_tiles: int
    group: int  # tiles per group (one mask and one read of the remote entries each)


class EvaAttention(HeadProjections):
    """Causal EVA with the public reference's parameter names, so its weights load strictly."""

    def __init__(self, config, layer_idx: int = 0):
        super().__init__(config, layer_idx)  # q_proj, k_proj, v_proj, out_proj
        self.window_size, self.chunk_size = config.window_size, config.chunk_size
        self.ext = config.window_size if config.overlap_window else 0
        self.exclude_window_chunks = config.exclude_window_chunks
        self.adaptive_mu_q = _adaptive_map(self.head_dim, config.adaptive_proj == "qk")
        self.adaptive_mu_k = _adaptive_map(self.head_dim, config.adaptive_proj == "qk")
        self.rel_pos_bias = T5RelativeBias(self.window_size, self.ext) if config.use_t5_bias else None
        self.layout = Tiling(self.window_size, self.chunk_size, self.ext, self.exclude_window_chunks, self.head_dim**-0.5)
        # Rows per query tile: a tile copies the remote entries once, so larger tiles copy them
        # less often but waste more masked local logits; 2w or 256 rows measured fastest
        # (benchmarks/attention.py at w=128, benchmarks/incremental.py at w=16).
        self.query_tile = self.window_size * max(2, -(-256 // self.window_size))

    def init_weights(self) -> None:
        """Inits of the reference: Xavier gain 1/√2 on q/k/v and A_q/A_k, Xavier on out."""
        self.init_projections(self.adaptive_mu_q[0], self.adaptive_mu_k[0])
        for mod in (*self.adaptive_mu_q[1:], *self.adaptive_mu_k[1:]):
            mod.reset_parameters()
        if self.rel_pos_bias is not None:
            nn.init.normal_(self.rel_pos_bias.relative_attention_bias.weight)

    @property
    def maps(self) -> AdaptiveMaps:
        return AdaptiveMaps(self.adaptive_mu_q, self.adaptive_mu_k)

    def _noise_seed(self) -> int | None:
        """A seed for the training noise ε of this forward (drawn from torch's RNG, so
        `torch.manual_seed` and activation checkpointing replay it); None in eval: no ε."""
        return int(torch.randint(0, 2**62, (1,))) if self.training else None

    def _dropout_seed(self) -> int:
        """The seed of this forward's attention dropout mask (evalm/dropout_mask.py), drawn from
        torch's RNG like ε's, so activation checkpointing replays it."""
        return int(torch.randint(0, 2**62, (1,)))

    def summarize(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Remote (key, value) of whole chunks: q, k, v (B, H, n, c, D) -> k̃, β (B, H, n, D)."""
        k_tilde, omega = summaries.keys(self.maps, q.mean(-2), k.mean(-2), self._noise_seed())
        beta, _ = summaries.values(k, v, omega, self.layout.scale)
        return k_tilde, beta

    def forward(self, x: Tensor, cache: Cache | None = None) -> Tensor:
        """x (B, T, E) -> (B, T, E); with a cache, continue after its n_seen tokens and update it."""
        B, T, _ = x.shape
        heads = (B, T, self.n_head, self.head_dim)  # the projections' own layout, not transposed
        q, k, v = (proj(x).view(heads) for proj in (self.q_proj, self.k_proj, self.v_proj))
        return self.out_proj(self.attend(q, k, v, cache).reshape(B, T, -1))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, cache: Cache | None = None) -> Tensor:
        """EVA of projected heads q, k, v (B, T, H, D) -> (B, T, H, D), without the projections:
        `forward`'s, and a Hugging Face attention's (evalm/hf_attention.py, q and k already rotated).
        q, k, v must be the caller's own tensors: the whole-sequence backward writes gradients over them."""
        plan, call = self._describe(q, cache)
        path = eva_paths.choose(call)
        eva_paths.report(self.layer_idx, path)
        if path.name in eva_paths.WHOLE:
            return self._attend_whole(q, k, v, fused=path.name == "fused")
        out = self._encode(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), cache, plan, path)
        return out.transpose(1, 2)

    def _describe(self, q: Tensor, cache: Cache | None) -> tuple[TilePlan, EvaCall]:
        """The query grid of this call and the facts that choose its path (q: (B, T, H, D))."""
        B, T = q.shape[:2]
        n_seen = cache.n_seen if cache is not None else 0
        state = cache.layers[self.layer_idx] if cache is not None else None
        prefix = cache.prefix[self.layer_idx] if cache is not None else None
        n_prefix = prefix[0].shape[-2] if prefix is not None else 0
        plan = self._plan(B, n_seen, T, (n_seen + T) // self.chunk_size + n_prefix)
        cached = [*(state.remote_k if state is not None else ()), *(prefix or ())]
        no_new_chunk = (n_seen + T) // self.chunk_size == parts_len(state.remote_k if state is not None else ())
        call = EvaCall(
            whole=cache is None,
            kernel=flash.usable_on(q),
            dropout=self.training and self.attn_dropout > 0,
            grad=torch.is_grad_enabled(),
            full_precision=q.dtype in (torch.float32, torch.float64),
            one_tile_per_group=plan.n_tiles == 1 or plan.group == 1,
            forks=B > 1 and plan.n_tiles == 1 and no_new_chunk and all(p.shape[0] == 1 for p in cached),
        )
        return plan, call

    def _plan(self, B: int, n_seen: int, T: int, n_extra: int) -> TilePlan:
        """Tiles of at most `query_tile` rows from the block holding n_seen; groups within TILE_LOGITS."""
        w = self.window_size
        grid_start = n_seen // w * w
        lead = n_seen - grid_start
        rows = min(self.query_tile, -(-(lead + T) // w) * w)  # a short segment gets a short tile
        n_tiles = -(-(lead + T) // rows)
        per_tile = B * self.n_head * rows * (self.ext + rows + n_extra)
        return TilePlan(grid_start, lead, rows, n_tiles, max(1, min(n_tiles, TILE_LOGITS // per_tile)))

    def _attend_whole(self, q: Tensor, k: Tensor, v: Tensor, fused: bool) -> Tensor:
        """A whole sequence (training, one-shot scoring), q, k, v (B, T, H, D): linear memory, the
        chunk state and the logits recomputed in backward (paths fused and recompute)."""
        w, s = self.window_size, self.layout.scale
        bias = None
        if self.rel_pos_bias is not None:  # one block's (w, ext + w) bias: it depends on i − j only
            distance = torch.arange(w, device=q.device)[:, None] + self.ext - torch.arange(self.ext + w, device=q.device)
            bias = s * self.rel_pos_bias(distance.clamp(min=0)).to(q.dtype)
        dropout = self.attn_dropout if self.training else 0.0
        seed = self._dropout_seed() if dropout > 0 else 0
        t = dataclasses.replace(self.layout, dropout=dropout, seed=seed, group_logits=tiling.GROUP_LOGITS,
                                fused=fused, noise_seed=self._noise_seed())
        return eva_attention(t, q, k, v, self.maps, bias, consume=True)  # q, k, v: this call's own projections

    def _encode(self, q: Tensor, k: Tensor, v: Tensor, cache: Cache | None, plan: TilePlan, path: EvaPath) -> Tensor:
        """New queries q, k, v (B, H, T, D) after the cache's n_seen tokens (paths tiles and forks):
        complete chunks become remote entries, then the queries attend, then the cache is updated."""
        B, H, T, D = q.shape
        w, c, ext = self.window_size, self.chunk_size, self.ext
        state: EvaState | None = cache.layers[self.layer_idx] if cache is not None else None
        n_seen = cache.n_seen if cache is not None else 0
        first_row = max(0, n_seen // w * w - ext)
        if state is not None:
            seq_k = torch.cat([state.local_k.expand(B, -1, -1, -1), k], -2)
            seq_v = torch.cat([state.local_v.expand(B, -1, -1, -1), v], -2)
            chunk_q = torch.cat([state.pending_q.expand(B, -1, -1, -1), q], -2)
            remote_k, remote_v, n_owned = state.remote_k, state.remote_v, state.n_owned
        else:
            seq_k, seq_v, chunk_q, remote_k, remote_v, n_owned = k, v, q, (), (), 0

        # Chunks completed by this segment become remote entries (Algorithm 1: compress every c tokens).
        n_done = parts_len(remote_k)
        n_new = (n_seen + T) // c - n_done
        if n_new > 0:
            at = n_done * c - first_row
            shape = (B, H, n_new, c, D)
            new_k, new_v = self.summarize(
                chunk_q[..., : n_new * c, :].reshape(shape),
                seq_k[..., at : at + n_new * c, :].reshape(shape),
                seq_v[..., at : at + n_new * c, :].reshape(shape),
            )
            remote_k, _ = parts_append(remote_k, new_k, n_owned)
            remote_v, n_owned = parts_append(remote_v, new_v, n_owned)

        entries = Entries(remote_k, remote_v, cache.prefix[self.layer_idx] if cache is not None else None,
                          cache.own_logit_bias if cache is not None else 0.0)
        out = self._attend(q, seq_k, seq_v, entries, n_seen, first_row, plan, path)
        if cache is not None:
            n_after = n_seen + T
            keep = max(0, n_after // w * w - ext) - first_row  # evict rows before the new window start
            cache.layers[self.layer_idx] = EvaState(
                local_k=seq_k[..., keep:, :].clone(),
                local_v=seq_v[..., keep:, :].clone(),
                pending_q=chunk_q[..., n_after // c * c - n_seen // c * c :, :].clone(),
                remote_k=remote_k,
                remote_v=remote_v,
                n_owned=n_owned,
            )
        return out

    def _attend(self, q, seq_k, seq_v, entries: Entries, n_seen: int, first_row: int, plan: TilePlan,
                path: EvaPath) -> Tensor:
        """Queries at n_seen … n_seen+T−1 over their window, the visible chunks and any merged prefix.

        Queries lie on the plan's grid (dummy rows pad the first and last tile and are dropped);
        tile j's local keys are the ext + rows positions that end with it, so one unfold gives
        every tile its keys and autograd sees one view, not one slice per tile.
        """
        B, H, T, D = q.shape
        ext, rows, lead, n_tiles = self.ext, plan.rows, plan.lead, plan.n_tiles
        split = path.name.endswith("-split")
        q_grid = F.pad(q, (0, 0, lead, n_tiles * rows - lead - T)).unflatten(-2, (n_tiles, rows))
        key_pad = (first_row - (plan.grid_start - ext), plan.grid_start + n_tiles * rows - (n_seen + T))
        k_grid = F.pad(seq_k, (0, 0, *key_pad)).unfold(-2, ext + rows, rows)  # (B, H, n_tiles, D, ext + rows)
        v_grid = F.pad(seq_v, (0, 0, *key_pad)).unfold(-2, ext + rows, rows)
        arange = torch.arange(max(ext + rows, T), device=q.device)
        if n_tiles == 1:  # a short segment (a test input): its real rows only, no dummy queries
            k_pos = (plan.grid_start - ext + arange[: ext + lead + T]).view(1, 1, -1)
            q_pos = (n_seen + arange[:T]).view(1, T, 1)
            local = slice(0, ext + lead + T)  # the single tile's local keys, without the trailing pad
            if path.name.startswith("forks"):
                return self._attend_folded(q, k_grid[..., local], v_grid[..., local], entries, q_pos, k_pos, split)
            out = self._attend_group(q.unsqueeze(2), k_grid[..., local], v_grid[..., local], entries, q_pos, k_pos, split)
            return out.squeeze(2)
        starts = plan.grid_start + torch.arange(n_tiles, device=q.device) * rows
        outs = []
        for q_tiles, k_tiles, v_tiles, start in zip(*(x.split(plan.group, 2) for x in (q_grid, k_grid, v_grid)),
                                                    starts.split(plan.group)):
            q_pos = start[:, None, None] + arange[:rows, None]  # (G, rows, 1)
            k_pos = start[:, None, None] - ext + arange[: ext + rows]  # (G, 1, ext + rows)
            outs.append(self._attend_group(q_tiles, k_tiles, v_tiles, entries, q_pos, k_pos, split))
        return torch.cat(outs, 2).flatten(2, 3)[..., lead : lead + T, :]

    def _attend_folded(self, q, k_local, v_local, entries: Entries, q_pos: Tensor, k_pos: Tensor, split: bool) -> Tensor:
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
        out = self._attend_group(
            q.transpose(0, 1).reshape(1, H, 1, B * T, D), k_folded, v_folded, entries,
            q_pos.repeat(1, B, 1), k_pos.repeat(1, 1, B), split,
            same_sequence=row_sequence[:, None] == key_sequence[None, :],
        )
        return out.view(H, B, T, D).transpose(0, 1)

    def _attend_group(self, q_tiles, k_tiles, v_tiles, entries: Entries, q_pos: Tensor, k_pos: Tensor, split: bool,
                      same_sequence: Tensor | None = None) -> Tensor:
        """G tiles: q_tiles (B, H, G, rows, D) at q_pos (G, rows, 1); local k/v_tiles (B, H, G, D, L) at
        k_pos (G, 1, L) -> (B, H, G, rows, D). `same_sequence` (rows, L), when rows of several
        sequences share one tile, keeps each row on its own sequence's local keys."""
        B, H, G, rows, D = q_tiles.shape
        masks, keys, values = self._group_entries(k_tiles, v_tiles, entries, q_pos, k_pos, same_sequence, q_tiles.dtype)
        if split:  # one tile, no graph: each key set softmaxed apart (evalm/joint_softmax.py)
            return joint_softmax(q_tiles[:, :, 0] * self.layout.scale, keys, values, masks).unsqueeze(2)
        mask = torch.cat(masks, -1).unsqueeze(1)  # (G, 1, rows, K): broadcast over heads
        n_keys = mask.shape[-1]
        if B > 1:
            mask = mask.expand(B, -1, -1, -1, -1).reshape(B * G, 1, rows, n_keys)
        out = F.scaled_dot_product_attention(
            q_tiles.transpose(1, 2).reshape(B * G, H, rows, D),
            torch.cat(keys, -2).reshape(B * G, H, n_keys, D),
            torch.cat(values, -2).reshape(B * G, H, n_keys, D),
            attn_mask=mask,
            dropout_p=self.attn_dropout if self.training else 0.0,
            scale=self.layout.scale,
        )
        return out.view(B, G, H, rows, D).transpose(1, 2)

    def _group_entries(self, k_tiles, v_tiles, entries: Entries, q_pos, k_pos, same_sequence, dtype):
        """Additive masks (G, rows, K_p), keys and values (B, G, H, K_p, D) of a group's key sets:
        its local rows, the chunks its queries may see, any merged prefix."""
        B, H, G = k_tiles.shape[:3]
        own_bias = entries.own_bias
        window_start = self.layout.window_start(q_pos)  # (G, rows, 1)
        local = torch.full((G, q_pos.shape[1], k_pos.shape[-1]), own_bias, dtype=dtype, device=q_pos.device)
        if self.rel_pos_bias is not None:
            local = local + self.layout.scale * self.rel_pos_bias((q_pos - k_pos).clamp(min=0)).to(dtype)
        visible = (k_pos <= q_pos) & (k_pos >= window_start)
        if same_sequence is not None:
            visible = visible & same_sequence
        masks = [local.masked_fill(~visible, float("-inf"))]
        keys, values = [k_tiles.permute(0, 2, 1, 4, 3)], [v_tiles.permute(0, 2, 1, 4, 3)]  # (B, G, H, L, D)

        limit = self.layout.limit(q_pos)  # (G, rows, 1): chunks r < limit are visible
        n_vis = min(int(limit.max()), parts_len(entries.remote_k))
        if n_vis > 0:
            keys.extend(p.unsqueeze(1).expand(B, G, -1, -1, -1) for p in parts_head(entries.remote_k, n_vis))
            values.extend(p.unsqueeze(1).expand(B, G, -1, -1, -1) for p in parts_head(entries.remote_v, n_vis))
            hidden = torch.arange(n_vis, device=q_pos.device) >= limit  # (G, rows, n_vis)
            masks.append(torch.full(hidden.shape, own_bias, dtype=dtype, device=q_pos.device).masked_fill(hidden, float("-inf")))
        if entries.prefix is not None:
            prefix_k, prefix_v = entries.prefix
            keys.append(prefix_k.unsqueeze(1).expand(B, G, -1, -1, -1))
            values.append(prefix_v.unsqueeze(1).expand(B, G, -1, -1, -1))
            masks.append(torch.zeros(G, q_pos.shape[1], prefix_k.shape[-2], dtype=dtype, device=q_pos.device))
        return masks, keys, values
