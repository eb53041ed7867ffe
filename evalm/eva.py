"""Causal EVA attention: block-local softmax attention plus one compressed pseudo-token per
completed earlier chunk, in one softmax (docs/eva.md, "The closed form"; EVALM paper §3.1).

For the query at absolute position i (the visibility rule is `Tiling.window_start` / `Tiling.limit`):
  local keys  L(i) = { j : max(0, ⌊i/w⌋·w − ext) ≤ j ≤ i }   (a causal block, not a sliding window)
  remote keys R(i) = { chunks r : S/c ≤ r < ⌊i/c⌋ }          (or before the query's window, with
                                                               exclude_window_chunks)
  sink keys   Z(i) = { j : j < min(S, window_start(i)) }      (sink_tokens S, 0 by default: the first
                                                               S tokens exact, their chunks unsummarized)
  chunk r:    k̃_r and β_r from evalm/summaries.py
  o_i = softmax([s·q_i·k_j + t5(i, j)]_{j∈L(i)} ⧺ [s·q_i·k_j]_{j∈Z(i)} ⧺ [s·q_i·k̃_r]_{r∈R(i)}) · [v_j ⧺ v_j ⧺ β_r]

Legend of this file:
  B sequences, H heads, D head dimension, T new tokens, w window (block), c chunk, ext 0 or w
  n_seen     tokens a cache had encoded before this call (0 without one)
  first_row  absolute position of the first cached window row, max(0, ⌊n_seen/w⌋·w − ext)
  seq_k/v    (B, H, n_seen − first_row + T, D): the cached window rows, then the new ones
  chunk_q    (B, H, ·, D) queries from the start of the incomplete chunk: its pending rows, then the new

`evalm/eva_paths.py` chooses the path a call takes and says why, once; `forward` runs it by the
path's fields: a whole sequence through evalm/whole_sequence.py (with the path's implementation,
fused or plain), a cache's tiles or forks through evalm/tiles.py, one `Tiling` for either.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from evalm import eva_paths, flash, flex, flex_kernel, selection, summaries, tile_call, tiles, tiling, whole_sequence
from evalm.cache import Cache, Parts, Rows, parts_append, parts_bytes, parts_len
from evalm.eva_paths import EvaCall, EvaPath, Route
from evalm.eva_settings import EvaSettings
from evalm.heads import HeadProjections, HeadShape
from evalm.summaries import AdaptiveMaps
from evalm.tiling import Ablation, Tiling


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
    remote_k: Parts = ()  # parts (B, H, C_i, D): k̃_r of completed chunks from S/c on, in order
    remote_v: Parts = ()  # parts (B, H, C_i, D): β_r
    n_owned: int = 0  # trailing remote parts this cache may merge into
    sink_k: Tensor | None = None  # (B or 1, H, min(S, n), D) keys of the sink tokens (None: S = 0)
    sink_v: Tensor | None = None
    sink_out: int = 0  # sink tokens before the window start, min(S, first window row): not local keys
    tokens_k: Rows = Rows()  # with selection: the summarised chunks' own keys (B or 1, H, c per summary, D)
    tokens_v: Rows = Rows()  # and values, read only at the rows a query selects (evalm/selection.py)
    bounds: Rows = Rows()  # select_by "bound" or "window-bound": each summarised chunk's key minima and maxima (2 rows a chunk)

    def entries(self) -> tuple[Tensor, Tensor]:
        """Everything a later token may attend to: (B, H, sink_out + n_chunks + ℓ, D) keys and values."""
        sink = [(x[..., : self.sink_out, :].expand(self.local_k.shape[0], -1, -1, -1),) if self.sink_out else ()
                for x in (self.sink_k, self.sink_v)]
        return (torch.cat([*sink[0], *self.remote_k, self.local_k], -2),
                torch.cat([*sink[1], *self.remote_v, self.local_v], -2))

    def nbytes(self) -> int:
        sink = tuple(x for x in (self.sink_k, self.sink_v) if x is not None)
        tokens = self.tokens_k.nbytes() + self.tokens_v.nbytes() + self.bounds.nbytes()
        return parts_bytes((self.local_k, self.local_v, self.pending_q, *self.remote_k, *self.remote_v, *sink)) + tokens

    def disowned(self) -> EvaState:
        return dataclasses.replace(self, n_owned=0, tokens_k=self.tokens_k.disowned(), tokens_v=self.tokens_v.disowned(),
                                   bounds=self.bounds.disowned())


class EvaAttention(HeadProjections):
    """Causal EVA with the public reference's parameter names, so its weights load strictly.

    `EvaAttention(config, layer)`: a whole layer of a `ModelConfig` (an `EvaSettings` with heads), its own
    q/k/v/out projections first (the registry's form, evalm/attention.py). `EvaAttention(settings, layer,
    heads)`: EVA's own parts only (A_q, A_k, the T5 bias, the rule), for a host module that projects and
    rotates its own heads and calls `attend` (a Llama's attention, evalm/hf_llama.py)."""

    def __init__(self, settings: EvaSettings, layer_idx: int = 0, heads: HeadShape | None = None):
        super().__init__(heads or HeadShape.of(settings), layer_idx, projections=heads is None)
        self.window_size, self.chunk_size = settings.window_size, settings.chunk_size
        self.ext = settings.window_size if settings.overlap_window else 0
        self.exclude_window_chunks = settings.exclude_window_chunks
        self.adaptive_mu_q = _adaptive_map(self.head_dim, settings.adaptive_proj == "qk")
        self.adaptive_mu_k = _adaptive_map(self.head_dim, settings.adaptive_proj == "qk")
        self.rel_pos_bias = T5RelativeBias(self.window_size, self.ext) if settings.use_t5_bias else None
        # Where sink keys sit for a query (docs/eva.md, "Sink tokens"): None, at their own positions; or a
        # function moving keys (…, D) by a position shift (broadcast over their rows) that a rotary host
        # sets (evalm/hf_llama.py), so a block's sink sits right before its window as in StreamingLLM's cache
        self.sink_shift = None
        # The same for the tokens of the chunks a query selects (evalm/selection.py): None, at their own
        # positions; or the host's move, placing them right before the query's window (`selected_positions`)
        self.select_shift = None
        self.layout = dataclasses.replace(Tiling.of(settings, self.head_dim), select_group=(heads.group if heads else 1))
        # Rows per query tile: a tile copies the remote entries once, so larger tiles copy them
        # less often but waste more masked local logits; 2w or 256 rows measured fastest
        # (benchmarks/attention.py at w=128, benchmarks/incremental.py at w=16).
        self.query_tile = self.window_size * max(2, -(-256 // self.window_size))
        self.reported_paths: set[str] = set()  # the paths `--debug` has named for this layer (eva_paths.report)

    def ablate(self, ablation: Ablation) -> None:
        """Switch one branch of the softmax at evaluation time (`Ablation`, evalm/tiling.py): the rule
        every path and the cache read changes, the weights do not."""
        self.layout = dataclasses.replace(self.layout, ablation=ablation)

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

    # The seeds are drawn eagerly even inside a compiled block (train.compile): a compiled draw would take
    # inductor's generator, not torch's, so a compiled run would not draw what an eager one does, nor what
    # activation checkpointing replays.
    @torch.compiler.disable
    def _noise_seed(self) -> int:
        """A seed for the training noise ε of this forward (drawn from torch's RNG, so
        `torch.manual_seed` and activation checkpointing replay it); called in training only (`_tiling`)."""
        return int(torch.randint(0, 2**62, (1,)))

    @torch.compiler.disable
    def _dropout_seed(self) -> int:
        """The seed of this forward's attention dropout mask (evalm/dropout_mask.py), drawn from
        torch's RNG like ε's, so activation checkpointing replays it."""
        return int(torch.randint(0, 2**62, (1,)))

    def summarize(self, q: Tensor, k: Tensor, v: Tensor, noise_seed: int | None = None) -> tuple[Tensor, Tensor]:
        """Remote (key, value) of whole chunks: q, k, v (B, H, n, c, D) -> k̃, β (B, H, n, D), with
        the training noise ε of `noise_seed` (None: none)."""
        k_tilde, omega = summaries.keys(self.maps, q.mean(-2), k.mean(-2), noise_seed)
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
        eva_paths.report(self.layer_idx, path, self.reported_paths)
        t = self._tiling()
        if path.route.whole:
            return self._attend_whole(t, path, q, k, v)
        out = self._encode(tile_call.TiledCall(t, plan, path, self._entries(cache), self.rel_pos_bias, self.sink_shift,
                                           self.select_shift),
                           q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), cache)
        return out.transpose(1, 2)

    def _tiling(self) -> Tiling:
        """This call's `Tiling`: the layer's rule with this forward's attention dropout rate and mask
        seed, and the seed of the training noise ε, drawn from torch's RNG in this order (so
        `torch.manual_seed` and activation checkpointing replay them); in eval none is drawn."""
        dropout = self.attn_dropout if self.training else 0.0
        seed = self._dropout_seed() if dropout > 0 else 0
        return dataclasses.replace(self.layout, dropout=dropout, seed=seed, group_logits=tiling.GROUP_LOGITS,
                                   noise_seed=self._noise_seed() if self.training else None)  # eval: no call, no graph break

    def _describe(self, q: Tensor, cache: Cache | None) -> tuple[tile_call.TilePlan, EvaCall]:
        """The query grid of this call and the facts that choose its path (q: (B, T, H, D))."""
        B, T = q.shape[:2]
        n_seen = cache.n_seen if cache is not None else 0
        state = cache.layers[self.layer_idx] if cache is not None else None
        prefix = cache.prefix[self.layer_idx] if cache is not None else None
        n_prefix = prefix[0].shape[-2] if prefix is not None else 0
        sink = self.layout.sink
        plan = tiles.plan(self.layout, self.query_tile, B * self.n_head, n_seen, T,
                          (n_seen + T) // self.chunk_size + n_prefix + sink)
        cached = [*(state.remote_k if state is not None else ()), *(prefix or ())]
        no_new_chunk = self.layout.summarized(n_seen + T) == parts_len(state.remote_k if state is not None else ())
        call = EvaCall(
            whole=cache is None,
            kernel=flash.usable_on(q),
            dropout=self.training and self.attn_dropout > 0,
            grad=torch.is_grad_enabled(),
            full_precision=q.dtype in (torch.float32, torch.float64),
            one_tile_per_group=plan.n_tiles == 1 or plan.group == 1,
            # a sink still filling would become the batch's own, not the parent's shared one
            forks=B > 1 and plan.n_tiles == 1 and no_new_chunk and n_seen >= sink and all(p.shape[0] == 1 for p in cached),
            sink=sink > 0,
            flex=cache is None and flex.usable_on(q),
            select=self.layout.select > 0,
            select_moved=self.select_shift is not None,
            new_tokens=T,
        )
        return plan, call

    def _attend_whole(self, t: Tiling, path: EvaPath, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """A whole sequence (training, one-shot scoring), q, k, v (B, T, H, D): on a GPU one flex_attention
        call (path flex); else linear memory, the chunk state and the logits recomputed in backward
        (paths fused and recompute)."""
        if path.route is Route.FLEX:
            return self._attend_flex(t, q, k, v)
        w = self.window_size
        bias = None
        if self.rel_pos_bias is not None:  # one block's (w, ext + w) bias: it depends on i − j only
            distance = torch.arange(w, device=q.device)[:, None] + self.ext - torch.arange(self.ext + w, device=q.device)
            bias = t.scale * self.rel_pos_bias(distance.clamp(min=0)).to(q.dtype)
        implementation = whole_sequence.FUSED if path.route is Route.FUSED else whole_sequence.PLAIN
        call = whole_sequence.WholeSequence(t, implementation, self.maps, consume=True)  # q, k, v: this call's own
        return whole_sequence.eva_attention(call, q, k, v, bias)

    def _attend_flex(self, t: Tiling, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Path flex: one flex_attention call over tokens, summaries and sink keys (evalm/flex.py). Where the
        kernel cannot serve the call (evalm/flex_kernel.py), the `recompute` route does, with a warning."""
        try:
            return flex.attend_layer(flex.LayerParts(t, self.maps, self.rel_pos_bias, self.sink_shift), q, k, v)
        except flex_kernel.KernelUnavailable as why:
            warnings.warn(f"EVA's GPU route falls back to the recompute route (plain PyTorch, linear memory, "
                          f"slower): {why}", RuntimeWarning, stacklevel=2)
        return self._attend_whole(t, EvaPath(Route.RECOMPUTE, "the flex kernel cannot serve the call"), q, k, v)

    def _entries(self, cache: Cache | None) -> tile_call.Entries:
        """What a cached call reads besides its window: completed chunks are added in `_encode`."""
        prefix = cache.prefix[self.layer_idx] if cache is not None else None
        return tile_call.Entries((), (), prefix, cache.own_logit_bias if cache is not None else 0.0)

    def _kept(self, rows: tuple[Rows, Rows, Rows], k: Tensor, v: Tensor, first: int) -> tuple[Rows, Rows, Rows]:
        """New summarised chunks' rows (chunks first, first + 1, …) that selection reads later (evalm/selection.py):
        their keys and values, and with select_by "bound" or "window-bound" Quest's bounds of `_bound_keys` (two
        rows a chunk; the ranking needs no graph)."""
        tokens_k, tokens_v, bounds = rows
        if self.layout.by_bound:
            bounds = bounds.append(selection.key_bounds(self._bound_keys(k, first).detach(), self.chunk_size))
        return tokens_k.append(k), tokens_v.append(v), bounds

    def _bound_keys(self, k: Tensor, first: int) -> Tensor:
        """The keys (B, H, n·c, D) of whole chunks first … first + n − 1 as `select_by` bounds them: as they are, or
        for "window-bound" each chunk M turned back by (M + 1)·c, to sit at −c … −1; a query turned back by its
        window's start ws then reads them at ws − c … ws − 1, right before its window (evalm/tile_selection.py)."""
        if self.layout.select_by != "window-bound":
            return k
        c = self.chunk_size
        chunk = first + torch.arange(k.shape[-2], device=k.device) // c
        return self.select_shift(k, -c * (chunk + 1))

    def _encode(self, call: tile_call.TiledCall, q: Tensor, k: Tensor, v: Tensor, cache: Cache | None) -> Tensor:
        """New queries q, k, v (B, H, T, D) after the cache's n_seen tokens (paths tiles and forks):
        complete chunks become remote entries, then the queries attend, then the cache is updated."""
        B, H, T, D = q.shape
        w, c, ext = self.window_size, self.chunk_size, self.ext
        state: EvaState | None = cache.layers[self.layer_idx] if cache is not None else None
        n_seen = call.plan.n_seen
        first_row = max(0, n_seen // w * w - ext)
        if state is not None:
            seq_k = torch.cat([state.local_k.expand(B, -1, -1, -1), k], -2)
            seq_v = torch.cat([state.local_v.expand(B, -1, -1, -1), v], -2)
            chunk_q = torch.cat([state.pending_q.expand(B, -1, -1, -1), q], -2)
            remote_k, remote_v, n_owned = state.remote_k, state.remote_v, state.n_owned
            sink_k, sink_v = state.sink_k, state.sink_v
            tokens_k, tokens_v, bounds = state.tokens_k, state.tokens_v, state.bounds
        else:
            seq_k, seq_v, chunk_q, remote_k, remote_v, n_owned = k, v, q, (), (), 0
            sink_k = sink_v = None
            tokens_k = tokens_v = bounds = Rows()
        S = call.t.sink
        if n_seen < S:  # this segment holds sink tokens: keep their rows (copies: a view would keep all of k)
            head_k, head_v = k[..., : S - n_seen, :], v[..., : S - n_seen, :]
            sink_k = head_k.clone() if sink_k is None else torch.cat([sink_k.expand(B, -1, -1, -1), head_k], -2)
            sink_v = head_v.clone() if sink_v is None else torch.cat([sink_v.expand(B, -1, -1, -1), head_v], -2)

        # Chunks completed by this segment become remote entries (Algorithm 1: compress every c tokens);
        # the S/c chunks of sink tokens have none.
        n_done = parts_len(remote_k)  # summaries of chunks first_chunk … first_chunk + n_done − 1
        n_new = call.t.summarized(n_seen + T) - n_done
        if n_new > 0:
            first = (call.t.first_chunk + n_done) * c  # the first new chunk's first token
            at, q_at = first - first_row, first - n_seen // c * c
            shape = (B, H, n_new, c, D)
            new_k, new_v = self.summarize(
                chunk_q[..., q_at : q_at + n_new * c, :].reshape(shape),
                seq_k[..., at : at + n_new * c, :].reshape(shape),
                seq_v[..., at : at + n_new * c, :].reshape(shape),
                call.t.noise_seed,
            )
            remote_k, _ = parts_append(remote_k, new_k, n_owned)
            remote_v, n_owned = parts_append(remote_v, new_v, n_owned)
            if call.t.select:
                tokens_k, tokens_v, bounds = self._kept((tokens_k, tokens_v, bounds), seq_k[..., at : at + n_new * c, :],
                                                        seq_v[..., at : at + n_new * c, :], first // c)

        sink = (sink_k, sink_v) if sink_k is not None else None
        tokens = (tokens_k.views(), tokens_v.views()) if call.t.select and len(tokens_k) else None
        entries = call.entries._replace(remote_k=remote_k, remote_v=remote_v, sink=sink, tokens=tokens,
                                        bounds=bounds.views() if tokens is not None else None)
        out = tiles.attend(dataclasses.replace(call, entries=entries), q, seq_k, seq_v)
        if cache is not None:
            n_after = n_seen + T
            keep = max(0, n_after // w * w - ext) - first_row  # evict rows before the new window start
            cache.layers[self.layer_idx] = EvaState(
                seq_k[..., keep:, :].clone(), seq_v[..., keep:, :].clone(),
                pending_q=chunk_q[..., n_after // c * c - n_seen // c * c :, :].clone(),
                remote_k=remote_k, remote_v=remote_v, n_owned=n_owned, sink_k=sink_k, sink_v=sink_v,
                sink_out=min(S, max(0, n_after // w * w - ext)), tokens_k=tokens_k, tokens_v=tokens_v,
                bounds=bounds)
        return out


def eva_layers(model: nn.Module) -> list[EvaAttention]:
    """Every EVA layer of `model` (an EVALM, or a transformers model with EVA attention)."""
    return [m for m in model.modules() if isinstance(m, EvaAttention)]


def ablate(model: nn.Module, ablation: Ablation | str) -> int:
    """Set `ablation` on every EVA layer of `model`; returns how many layers it reached (0: the model has no
    EVA attention)."""
    ablation = Ablation(ablation)
    layers = eva_layers(model)
    for layer in layers:
        layer.ablate(ablation)
    return len(layers)


def select(model: nn.Module, k: int) -> int:
    """Selection of k chunks (docs/eva.md, "Selection"; 0: none) on every EVA layer of `model`, read at evaluation
    time on its weights; returns how many layers it reached (0: the model has no EVA attention)."""
    layers = eva_layers(model)
    for layer in layers:
        layer.layout = dataclasses.replace(layer.layout, select=k, select_only=layer.layout.select_only and k > 0)
    return len(layers)
