"""Causal EVA attention (EVA_SPEC §1): block-local softmax attention plus one compressed
pseudo-token per completed earlier chunk, in one softmax.

For the query at absolute position i, with block b = ⌊i/w⌋ and chunk a = ⌊i/c⌋ (§1.3):
  local keys  L(i) = { j : max(0, b·w − ext) ≤ j ≤ i }          (a causal block, not a sliding window)
  remote keys R(i) = { chunks r : r < a }                        (or r < ⌊(b·w − ext)/c⌋ with
                                                                   exclude_window_chunks, §1.7)
  chunk r:   k̃_r = A_k(mean k),  ω_r = A_q(mean q) + k̃_r (+ ε ~ N(0, I) in training only),
             β_r = Σ_j softmax_j(s·ω_r·k_j − s·‖k_j‖²/2) v_j      (causal EVA has no 0.5 in ω; ‖k‖² is scaled by s)
  o_i = softmax([s·q_i·k_j + t5(i, j)]_{j∈L(i)} ⧺ [s·q_i·k̃_r]_{r∈R(i)}) · [v_j ⧺ β_r]

One code path serves training (empty cache) and incremental encoding (EVA_SPEC §4.2): the new
tokens' keys follow the cached window rows, so a segment of any length continues exactly where
the cache stopped. Queries are tiled so a long segment's keys never exceed a fixed budget and each
group of tiles reads only the chunks its last query can see. Causality, windows, chunk visibility
and biases form one additive mask per tile, shared by all heads and sequences, never the
reference's dense B·H·n²/c tensor (§8.6); the joint softmax runs in PyTorch's fused attention
kernel with fp32 accumulation (§8.8).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from evalm import flash
from evalm.cache import Cache, Parts, parts_append, parts_bytes, parts_head, parts_len
from evalm.heads import HeadProjections, upcast
from evalm.recompute import eva_attention
from evalm.tiling import GROUP_LOGITS, Tiling

TILE_LOGITS = 1 << 24  # logits per query tile (B·H·tile·keys): bounds memory on long segments


def t5_bucket(distance: Tensor, num_buckets: int, max_distance: int) -> Tensor:
    """Causal T5 bucketing of non-negative distances: exact below num_buckets/2, then log-spaced."""
    max_exact = num_buckets // 2
    large = max_exact + (
        torch.log(distance.float().clamp(min=1) / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).long()
    large = large.clamp(max=num_buckets - 1)
    return torch.where(distance < max_exact, distance, large)


class T5RelativeBias(nn.Module):
    """One scalar per distance bucket, shared by all heads of a layer (EVA_SPEC §1.2)."""

    def __init__(self, window_size: int, ext: int):
        super().__init__()
        span = window_size + ext
        self.num_buckets = int(max(min(span // 2, 64), 16))
        self.max_distance = span
        self.ext = ext
        self.relative_attention_bias = nn.Embedding(self.num_buckets, 1)

    def forward(self, distance: Tensor) -> Tensor:
        """Bias for key distance i − j ≥ 0; the reference buckets max(0, i − j − ext) (§1.3, §8.4)."""
        bucket = t5_bucket((distance - self.ext).clamp(min=0), self.num_buckets, self.max_distance)
        return self.relative_attention_bias(bucket).squeeze(-1)


def _adaptive_map(head_dim: int, layer_norm: bool) -> nn.Sequential:
    """A_q / A_k: Linear(D→D) then LayerNorm(D), shared across heads ('qk' mode, §1.2)."""
    layers = [nn.Linear(head_dim, head_dim)]
    if layer_norm:
        layers.append(nn.LayerNorm(head_dim))
    return nn.Sequential(*layers)


@dataclass(frozen=True)
class EvaState:
    """One EVA layer after n_seen tokens (EVA_SPEC §4.2), a `LayerState` (evalm/cache.py). B is 1 for a
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
        # Rows per query tile: a tile copies the remote entries once, so larger tiles copy them
        # less often but waste more masked local logits; 2w or 256 rows measured fastest
        # (benchmarks/attention.py at w=128, benchmarks/incremental.py at w=16).
        self.query_tile = self.window_size * max(2, -(-256 // self.window_size))
        # A whole sequence without a cache (training) takes the recomputing path (evalm/recompute.py);
        # False selects the autograd path through _attend, kept as the tests' second oracle.
        self.recompute = True
        # On it, PyTorch's fused CPU kernel where it applies (evalm/flash.py); False keeps every call
        # on the plain-PyTorch recomputation, which the tests hold to the same oracles.
        self.fused = True
        self.group_logits = GROUP_LOGITS

    def init_weights(self) -> None:
        """Inits of the reference (§1.2): Xavier gain 1/√2 on q/k/v and A_q/A_k, Xavier on out."""
        self.init_projections(self.adaptive_mu_q[0], self.adaptive_mu_k[0])
        for mod in (*self.adaptive_mu_q[1:], *self.adaptive_mu_k[1:]):
            mod.reset_parameters()
        if self.rel_pos_bias is not None:
            nn.init.normal_(self.rel_pos_bias.relative_attention_bias.weight)

    def chunk_keys(self, q_mean: Tensor, k_mean: Tensor) -> tuple[Tensor, Tensor]:
        """k̃ and ω (B, H, n, D) of chunks from their mean query and key (§1.3)."""
        k_tilde = self.adaptive_mu_k(k_mean)
        omega = self.adaptive_mu_q(q_mean) + k_tilde  # μ_r: causal EVA has no 0.5 (§1.3)
        if self.training:  # one random-feature sample per chunk per head, fresh every forward
            omega = omega + torch.randn_like(omega)
        return k_tilde, omega

    def summarize(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Remote (key, value) of whole chunks: q, k, v (B, H, n, c, D) -> k̃, β (B, H, n, D)."""
        s = self.head_dim**-0.5
        k_tilde, omega = self.chunk_keys(q.mean(-2), k.mean(-2))
        # Products and sums rather than matmuls: on the strided chunk views of a whole sequence a
        # matmul would copy k and v and keep the copies for backward; a product keeps the views.
        lam = s * (k * omega.unsqueeze(-2)).sum(-1) - s * k.pow(2).sum(-1) / 2  # (B, H, n, c)
        weights = torch.softmax(upcast(lam), dim=-1).to(v.dtype)
        beta = (weights.unsqueeze(-1) * v).sum(-2)
        return k_tilde, beta

    def forward(self, x: Tensor, cache: Cache | None = None) -> Tensor:
        """x (B, T, E) -> (B, T, E); with a cache, continue after its n_seen tokens and update it."""
        B, T, _ = x.shape
        w, c, ext = self.window_size, self.chunk_size, self.ext
        if cache is None and self.recompute:
            heads = (B, T, self.n_head, self.head_dim)  # the projections' layout, not transposed
            out = self._attend_whole(self.q_proj(x).view(heads), self.k_proj(x).view(heads), self.v_proj(x).view(heads))
            return self.out_proj(out.reshape(B, T, -1))
        q, k, v = self.qkv(x)
        state: EvaState | None = cache.layers[self.layer_idx] if cache is not None else None
        n0 = cache.n_seen if cache is not None else 0
        p0 = max(0, (n0 // w) * w - ext)  # absolute position of the first cached window row
        if state is not None:
            seq_k = torch.cat([state.local_k.expand(B, -1, -1, -1), k], -2)  # positions p0 … n0+T−1
            seq_v = torch.cat([state.local_v.expand(B, -1, -1, -1), v], -2)
            chunk_q = torch.cat([state.pending_q.expand(B, -1, -1, -1), q], -2)  # from ⌊n0/c⌋·c
            remote_k, remote_v, n_owned = state.remote_k, state.remote_v, state.n_owned
        else:
            seq_k, seq_v, chunk_q, remote_k, remote_v, n_owned = k, v, q, (), (), 0

        # Chunks completed by this segment become remote entries (Algorithm 1: compress every c tokens).
        n_done = parts_len(remote_k)
        n_new = (n0 + T) // c - n_done
        if n_new > 0:
            at = n_done * c - p0
            shape = (B, self.n_head, n_new, c, self.head_dim)
            new_k, new_v = self.summarize(
                chunk_q[..., : n_new * c, :].reshape(shape),
                seq_k[..., at : at + n_new * c, :].reshape(shape),
                seq_v[..., at : at + n_new * c, :].reshape(shape),
            )
            remote_k, _ = parts_append(remote_k, new_k, n_owned)
            remote_v, n_owned = parts_append(remote_v, new_v, n_owned)

        out = self._attend(q, seq_k, seq_v, remote_k, remote_v, n0, p0, cache)
        if cache is not None:
            n1 = n0 + T
            keep = max(0, (n1 // w) * w - ext) - p0  # evict rows before the new window start
            cache.layers[self.layer_idx] = EvaState(
                local_k=seq_k[..., keep:, :].clone(),
                local_v=seq_v[..., keep:, :].clone(),
                pending_q=chunk_q[..., (n1 // c) * c - (n0 // c) * c :, :].clone(),
                remote_k=remote_k,
                remote_v=remote_v,
                n_owned=n_owned,
            )
        return self.merge(out)

    def _attend_whole(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """A whole sequence (training, one-shot scoring), q, k, v (B, T, H, D): linear memory,
        logits recomputed in backward (evalm/recompute.py)."""
        B, T, H, D = q.shape
        w, c, s = self.window_size, self.chunk_size, self.head_dim**-0.5
        n = T // c
        if n > 0:  # k̃ and ω here (the adaptive maps are modules); β inside the Function, from k and v
            rk, omega = self._summary_keys(q, k)
        else:
            rk = omega = q.new_zeros(B, H, 0, D)
        bias = None
        if self.rel_pos_bias is not None:  # one block's (w, ext + w) bias: it depends on i − j only
            distance = torch.arange(w, device=q.device)[:, None] + self.ext - torch.arange(self.ext + w, device=q.device)
            bias = s * self.rel_pos_bias(distance.clamp(min=0)).to(q.dtype)
        dropout = self.attn_dropout if self.training else 0.0
        seed = int(torch.randint(0, 2**62, (1,))) if dropout > 0 else 0
        tiling = Tiling(w, c, self.ext, self.exclude_window_chunks, s, dropout, seed, self.group_logits, self.fused)
        return eva_attention(tiling, q, k, v, rk, omega, bias)

    def _summary_keys(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """k̃ and ω (B, H, ⌊T/c⌋, D) of the whole chunks of q, k (B, T, H, D)."""
        n, c = q.shape[1] // self.chunk_size, self.chunk_size
        mean = lambda x: x[:, : n * c].unflatten(1, (n, c)).mean(2).transpose(1, 2).contiguous()  # noqa: E731
        return self.chunk_keys(mean(q), mean(k))

    def _attend(self, q, seq_k, seq_v, remote_k, remote_v, n0: int, p0: int, cache: Cache | None) -> Tensor:
        """Queries at n0 … n0+T−1 over their window, the visible chunks and any merged prefix.

        Queries are laid on a grid of tiles of at most `query_tile` rows starting at the block of
        n0 (dummy rows pad the first and last tile and are dropped); tile j's local keys are the
        ext + rows positions that end with it, so one unfold gives every tile its keys and autograd
        sees one view, not one slice per tile. Tiles run in groups, each group reading only the
        chunks its last query can see. One additive mask per group, shared by all heads, carries
        causality, windows, chunk visibility and the biases; PyTorch's fused attention kernel does
        the joint softmax with fp32 accumulation.
        """
        B, H, T, D = q.shape
        w, ext = self.window_size, self.ext
        g0 = (n0 // w) * w  # the grid starts at the block holding n0, so tiles are block-aligned
        rows = min(self.query_tile, -(-(n0 - g0 + T) // w) * w)  # a short segment gets a short tile
        n_tiles = -(-(n0 + T - g0) // rows)
        lead = n0 - g0
        q_grid = F.pad(q, (0, 0, lead, n_tiles * rows - lead - T)).unflatten(-2, (n_tiles, rows))
        key_pad = (p0 - (g0 - ext), g0 + n_tiles * rows - (n0 + T))  # grid keys start at g0 − ext
        k_grid = F.pad(seq_k, (0, 0, *key_pad)).unfold(-2, ext + rows, rows)  # (B, H, n_tiles, D, ext+rows)
        v_grid = F.pad(seq_v, (0, 0, *key_pad)).unfold(-2, ext + rows, rows)
        prefix = cache.prefix[self.layer_idx] if cache is not None else None
        own_bias = cache.own_logit_bias if cache is not None else 0.0

        if n_tiles == 1:  # a short segment (a test input): its real rows only, no dummy queries
            k_pos = (g0 - ext + torch.arange(ext + lead + T, device=q.device)).view(1, 1, -1)
            q_pos = (n0 + torch.arange(T, device=q.device)).view(1, T, 1)
            keys = slice(0, ext + lead + T)  # the single tile's local keys, without the trailing pad
            shared = [*remote_k, *(prefix or ())]
            if B > 1 and all(p.shape[0] == 1 for p in shared):
                return self._attend_folded(q, k_grid[..., keys], v_grid[..., keys], remote_k, remote_v, prefix,
                                           own_bias, q_pos, k_pos)
            out = self._attend_group(q.unsqueeze(2), k_grid[..., keys], v_grid[..., keys],
                                     remote_k, remote_v, prefix, own_bias, q_pos, k_pos)
            return out.squeeze(2)
        n_extra = parts_len(remote_k) + (prefix[0].shape[-2] if prefix is not None else 0)
        per_tile = B * H * rows * (ext + rows + n_extra)
        group = max(1, min(n_tiles, TILE_LOGITS // per_tile))
        tiles = torch.arange(n_tiles, device=q.device)
        outs = []
        for j, (qg, kg, vg) in enumerate(zip(q_grid.split(group, 2), k_grid.split(group, 2), v_grid.split(group, 2))):
            start = g0 + (tiles[j * group : j * group + qg.shape[2]] * rows)[:, None, None]  # (G, 1, 1)
            q_pos = start + torch.arange(rows, device=q.device)[:, None]
            k_pos = start - ext + torch.arange(ext + rows, device=q.device)
            outs.append(self._attend_group(qg, kg, vg, remote_k, remote_v, prefix, own_bias, q_pos, k_pos))
        return torch.cat(outs, 2).flatten(2, 3)[..., lead : lead + T, :]

    def _attend_folded(self, q, kl, vl, remote_k, remote_v, prefix, own_bias: float, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """A batch of forks scoring short inputs over one shared parent: q (B,H,T,D), kl/vl (B,H,1,D,L).

        The B sequences' rows are folded into one query block, so the parent's remote entries
        (thousands of chunk summaries after many demonstrations) are read once instead of being
        copied per candidate; a sequence mask keeps each row on its own local keys.
        """
        B, H, T, D = q.shape
        L = kl.shape[-1]
        fold = lambda x: x.permute(2, 1, 3, 0, 4).reshape(1, H, D, B * L).unsqueeze(2)  # noqa: E731 (B,H,1,D,L) -> (1,H,1,D,B·L)
        arange = lambda n: torch.arange(n, device=q.device)  # noqa: E731
        out = self._attend_group(
            q.transpose(0, 1).reshape(1, H, 1, B * T, D), fold(kl), fold(vl), remote_k, remote_v, prefix, own_bias,
            q_pos.repeat(1, B, 1), k_pos.repeat(1, 1, B),
            same_sequence=arange(B).repeat_interleave(T)[:, None] == arange(B).repeat_interleave(L)[None, :],
        )
        return out.view(H, B, T, D).transpose(0, 1)

    def _attend_group(self, qg, kg, vg, remote_k, remote_v, prefix, own_bias: float, q_pos: Tensor, k_pos: Tensor,
                      same_sequence: Tensor | None = None) -> Tensor:
        """G tiles: qg (B,H,G,rows,D) at q_pos (G,rows,1); local kg/vg (B,H,G,D,L) at k_pos (G,1,L) -> (B,H,G,rows,D).

        `same_sequence` (rows, L), when rows of several sequences share one tile, keeps each row
        on its own sequence's local keys.
        """
        B, H, G, rows, D = qg.shape
        w, c, ext = self.window_size, self.chunk_size, self.ext
        window_start = (q_pos // w * w - ext).clamp(min=0)  # (G, rows, 1)
        local = torch.full((G, rows, k_pos.shape[-1]), own_bias, dtype=qg.dtype, device=qg.device)
        if self.rel_pos_bias is not None:
            local = local + self.head_dim**-0.5 * self.rel_pos_bias((q_pos - k_pos).clamp(min=0)).to(qg.dtype)
        visible = (k_pos <= q_pos) & (k_pos >= window_start)
        if same_sequence is not None:
            visible = visible & same_sequence
        masks = [local.masked_fill(~visible, float("-inf"))]
        keys, values = [kg.permute(0, 2, 1, 4, 3)], [vg.permute(0, 2, 1, 4, 3)]  # (B, G, H, L, D)

        # Remote chunks: visible while r < ⌊i/c⌋, or only before the query's window (§1.7).
        limit = window_start // c if self.exclude_window_chunks else q_pos // c  # (G, rows, 1)
        n_vis = min(int(limit.max()), parts_len(remote_k))
        if n_vis > 0:
            keys.extend(p.unsqueeze(1).expand(B, G, -1, -1, -1) for p in parts_head(remote_k, n_vis))
            values.extend(p.unsqueeze(1).expand(B, G, -1, -1, -1) for p in parts_head(remote_v, n_vis))
            visible = torch.arange(n_vis, device=qg.device) < limit  # (G, rows, n_vis)
            masks.append(torch.full(visible.shape, own_bias, dtype=qg.dtype, device=qg.device).masked_fill(~visible, float("-inf")))
        if prefix is not None:  # entries merged from other caches: all visible, no bias
            keys.append(prefix[0].unsqueeze(1).expand(B, G, -1, -1, -1))
            values.append(prefix[1].unsqueeze(1).expand(B, G, -1, -1, -1))
            masks.append(torch.zeros(G, rows, prefix[0].shape[-2], dtype=qg.dtype, device=qg.device))

        # Scoring a short input (one tile, no graph, fp32/fp64): split softmax, summaries never copied
        if G == 1 and not torch.is_grad_enabled() and not (self.training and self.attn_dropout) \
                and qg.dtype in (torch.float32, torch.float64):
            return _joint_softmax(qg[:, :, 0] * self.head_dim**-0.5, keys, values, masks).unsqueeze(2)
        mask = torch.cat(masks, -1).unsqueeze(1)  # (G, 1, rows, K): broadcast over heads
        n_keys = mask.shape[-1]
        if B > 1:
            mask = mask.expand(B, -1, -1, -1, -1).reshape(B * G, 1, rows, n_keys)
        out = F.scaled_dot_product_attention(
            qg.transpose(1, 2).reshape(B * G, H, rows, D),
            torch.cat(keys, -2).reshape(B * G, H, n_keys, D),
            torch.cat(values, -2).reshape(B * G, H, n_keys, D),
            attn_mask=mask,
            dropout_p=self.attn_dropout if self.training else 0.0,
            scale=self.head_dim**-0.5,
        )
        return out.view(B, G, H, rows, D).transpose(1, 2)


def _joint_softmax(q: Tensor, keys: list[Tensor], values: list[Tensor], masks: list[Tensor]) -> Tensor:
    """One softmax over several key sets, never concatenated: q (B, H, rows, D), scaled; keys[i] and
    values[i] (B, 1, H, K_i, D); masks (1, rows, ·) additive, together as wide as the keys -> (B, H, rows, D).

    A test input scored over thousands of cached chunk summaries (incremental scoring, §4.2) would
    otherwise copy every summary into one key tensor per layer and call: at the 350M shape and
    2,000 demonstrations that copy cost as much as the attention itself. A key set that is one
    tensor for the whole batch (a parent cache's entries, expanded over forks) is read once, against
    the batch's rows folded into one block (a batched matmul would copy it once per sequence); when
    every row sees all of it, PyTorch's fused CPU kernel (evalm/flash.py) attends to it and the
    result joins the other sets' through the log-sum-exps, as the training path's parts do.
    """
    B, H, rows, _ = q.shape
    fold = lambda x: x.transpose(0, 1).reshape(1, H, B * rows, x.shape[-1])  # noqa: E731 (B,H,rows,·) -> (1,H,B·rows,·)
    unfold = lambda x: x.view(H, B, rows, x.shape[-1]).transpose(0, 1)  # noqa: E731 the inverse, a view
    shared = [k.shape[0] == 1 or k.stride(0) == 0 for k in keys]
    q_folded = fold(q) if any(shared) else None
    masks = torch.cat(masks, -1).split([k.shape[-2] for k in keys], -1)  # one mask may span several parts
    kernel = [one and k.shape[-2] > 0 and flash.usable_on(q) and bool(torch.isfinite(m).all()) for k, m, one in zip(keys, masks, shared)]
    parts = []  # (output, log-sum-exp) of the kernel's sets
    for k, v, m, use in zip(keys, values, masks, kernel):
        if use:
            o, lse = flash.attend(q_folded, k[:1, 0], v[:1, 0], m[0].repeat(B, 1) if m.any() else None)
            parts.append((unfold(o), unfold(lse.unsqueeze(-1)).squeeze(-1)))
    rest = [(k, v, m, one) for k, v, m, one, use in zip(keys, values, masks, shared, kernel) if not use]
    if rest:
        logits = [(unfold(torch.matmul(q_folded, k[:1, 0].transpose(-1, -2))) if one else torch.matmul(q, k[:, 0].transpose(-1, -2))).add_(m)
                  for k, _, m, one in rest]
        top = torch.stack([lg.amax(-1) for lg in logits]).amax(0).unsqueeze(-1)  # (B, H, rows, 1)
        probs = [lg.sub_(top).exp_() for lg in logits]
        total = sum(p.sum(-1, keepdim=True) for p in probs)
        out = sum(unfold(torch.matmul(fold(p), v[:1, 0])) if one else torch.matmul(p, v[:, 0])
                  for p, (_, v, _, one) in zip(probs, rest)).div_(total)
        parts.append((out, (top + total.log()).squeeze(-1)))
    lse = torch.stack([lse for _, lse in parts]).logsumexp(0)
    return sum(o * (part_lse - lse).exp().unsqueeze(-1) for o, part_lse in parts)
