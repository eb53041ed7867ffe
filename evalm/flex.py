"""EVA over a whole sequence on a GPU: the path "flex", one fused attention call per layer
(`torch.nn.attention.flex_attention`, compiled; docs/eva.md, "The GPU route").

A query's joint softmax over its local block, its sink keys and the chunk summaries it may see
(docs/eva.md, "The closed form") is one masked softmax attention over a longer key axis, the slots:

  [0, n)           token keys k_j, values v_j: the local keys, and the sink keys read in place
  [R, R + m)       k̃ and β of chunks first_chunk … first_chunk + m − 1     R = ⌈n/128⌉·128
  [Z, Z + nb·S)    with `sink_shift`: block b's copy of the S sink keys,     Z = R + ⌈m/128⌉·128
                   moved to sit right before its window, values v_0 … v_{S−1}

Each region starts on a 128-slot boundary (zeros between: never visible), so a 128 × 128 tile of
the kernel reads one region. `visible` is `Tiling`'s rule written on slots (the `mask_mod`); the
block mask, which tiles hold a visible slot and which hold only visible ones, comes from the same
rule by counting each row's visible slots per tile (`block_mask`), so the kernel skips every tile
outside the window, the sink and the staircase of summaries, and runs the rule only on the tiles
it cuts. `score_mod` adds the T5 bias to local keys and, in training, drops a key by the one hashed
mask of evalm/dropout_mask.py (−inf for a dropped key).

Attention dropout (the paper trains with 0.1): the kernel normalises over the keys it keeps, so two
calls run: with the mask (o′, ℓ′ of the kept keys) and without (ℓ, the joint softmax's), and
o = e^(ℓ′ − ℓ)/(1 − p) · o′ is dropout after the joint normalisation, every kept probability
P_ij/(1 − p) (the fused CPU path's composition, evalm/flash_dropout.py). Autograd differentiates
both calls and their ℓ (the kernel's backward takes ℓ's gradient), the chunk summaries
(evalm/summaries.py, batched) and the T5 bias (a captured tensor of the score_mod).

Legend: B sequences, H heads, n tokens, D head dimension, m summaries, w window, S sink tokens,
nb = ⌈n/w⌉ blocks, L slots; q (B, H, n, D), keys and values (B, H, L, D), ℓ (B, H, n).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from evalm import dropout_mask, flex_kernel, summaries
from evalm.heads import upcast
from evalm.summaries import AdaptiveMaps
from evalm.tiling import GROUP_LOGITS, Tiling

BLOCK = 128  # flex_attention's block-sparse tile (its default SPARSE_BLOCK_SIZE): rows and slots
ROWS_PER_COUNT = 1 << 22  # rows × tiles counted at once by `block_mask` (16 MiB of int32)


def _up(x: int) -> int:
    return -(-x // BLOCK) * BLOCK


def usable_on(x: Tensor) -> bool:
    """Whether the route takes x (B, n, H, D): a CUDA tensor in a floating dtype the kernel compiles
    (not float64), a head dimension of at least 16 and a power of two (the kernel's tile width), and
    a torch with flex_attention, whose kernel has not failed to compile on this device type."""
    D = x.shape[-1]
    return (x.is_cuda and x.dtype in (torch.float32, torch.bfloat16, torch.float16) and D >= 16
            and D & (D - 1) == 0 and flex_kernel.module() is not None and flex_kernel.compiles_on(x.device))


@dataclass(frozen=True)
class SlotLayout:
    """The key axis of one call (module docstring)."""

    n: int  # tokens: query rows and token slots
    chunks: int  # m: summaries, of chunks first_chunk … first_chunk + m − 1
    sink: int  # S
    copies: int  # nb·S slots of moved sink copies (0: sink keys are read in place)

    @property
    def remote(self) -> int:
        """R: the first summary's slot."""
        return _up(self.n)

    @property
    def moved(self) -> int:
        """Z: the first moved sink copy's slot."""
        return self.remote + _up(self.chunks)

    @property
    def length(self) -> int:
        """L: slots in all, a multiple of BLOCK."""
        return self.moved + _up(self.copies)


def rule_of(t: Tiling) -> Tiling:
    """The call's `Tiling` without its per-forward seeds and rate: what the mask reads, interned, so
    every layer of a model hands the compiled kernel the same rule object (no recompilation)."""
    return _interned(dataclasses.replace(t, dropout=0.0, seed=0, noise_seed=None, group_logits=GROUP_LOGITS))


@functools.lru_cache(maxsize=64)
def _interned(rule: Tiling) -> Tiling:
    return rule


def visible(t: Tiling, s: SlotLayout, q: Tensor, kv: Tensor) -> Tensor:
    """Whether the query at position q sees slot kv (broadcast integer tensors): `Tiling`'s rule."""
    token = kv < s.n
    seen = token & (kv <= q) & (kv >= t.window_start(q))
    r = kv - s.remote  # the summary of chunk first_chunk + r
    seen = seen | ((kv >= s.remote) & (r < s.chunks) & (r < t.remote_count(q)))
    if t.sink and s.copies:  # block ⌊q/w⌋'s copy, its first sink_count(q) keys
        m = kv - s.moved
        seen = seen | ((kv >= s.moved) & (m < s.copies) & (m // t.sink == q // t.window) & (m % t.sink < t.sink_count(q)))
    elif t.sink:
        seen = seen | (token & (kv < t.sink_count(q)))
    return seen


def _intervals(t: Tiling, s: SlotLayout, q: Tensor) -> list[tuple[Tensor, Tensor]]:
    """The slots row q sees, as disjoint [lo, hi) intervals: the same rule as `visible`."""
    start = t.window_start(q)
    out = [(start, q + 1), (torch.full_like(q, s.remote), s.remote + t.remote_count(q).clamp(max=s.chunks))]
    if t.sink and s.copies:
        lo = s.moved + q // t.window * t.sink
        out.append((lo, lo + t.sink_count(q)))
    elif t.sink:
        out.append((torch.zeros_like(q), t.sink_count(q)))
    return out


def tile_counts(t: Tiling, s: SlotLayout, device) -> tuple[Tensor, Tensor]:
    """(any, all), each (⌈n/BLOCK⌉, L/BLOCK) bool: whether some row of a row tile sees some slot of a
    slot tile, and whether every row sees every slot of it."""
    n_tiles, L = s.length // BLOCK, s.length
    edges = torch.arange(0, L + 1, BLOCK, device=device)
    lo_edge, hi_edge = edges[:-1], edges[1:]
    step = max(BLOCK, ROWS_PER_COUNT // n_tiles // BLOCK * BLOCK)
    some, every = [], []
    for r0 in range(0, s.n, step):
        q = torch.arange(r0, min(s.n, r0 + step), device=device)[:, None]
        count = sum((torch.minimum(hi, hi_edge) - torch.maximum(lo, lo_edge)).clamp(min=0)
                    for lo, hi in _intervals(t, s, q))  # (rows, tiles): a row's visible slots per tile
        pad = -len(q) % BLOCK  # the last row tile's missing rows see everything, change nothing
        count = torch.cat([count, count[-1:].expand(pad, -1)]) if pad else count
        count = count.view(-1, BLOCK, n_tiles)
        some.append(count.amax(1) > 0)
        every.append(count.amin(1) == BLOCK)
    return torch.cat(some), torch.cat(every)


def untraced(fn: Callable) -> Callable:
    """`fn`, run eagerly also where dynamo traces its caller (a compiled block, train.compile: a graph
    break there); elsewhere a plain call, not through dynamo's wrapper."""
    disabled = torch.compiler.disable(fn)

    @functools.wraps(fn)
    def call(*args):
        return disabled(*args) if torch.compiler.is_compiling() else fn(*args)

    return call


@untraced
@functools.lru_cache(maxsize=32)
def block_mask(rule: Tiling, s: SlotLayout, device: torch.device):
    """The `BlockMask` of a call: tiles that some row sees, those it sees whole ("full": the rule is
    not evaluated there), and the rule for the rest. Depends on the rule and the shape only, so
    every layer and step of a run shares one. Never traced: inside a compiled block (train.compile)
    dynamo would ignore the cache and rebuild the mask in every call, and inductor's CUDA loop merging
    failed on its index arithmetic (a graph break instead; docs/runs/2026-11-29-d9f2c41)."""
    module, _ = flex_kernel.module()
    some, every = tile_counts(rule, s, device)
    partial = some & ~every

    def by_row(tiles: Tensor) -> tuple[Tensor, Tensor]:  # counts (1, 1, rows) and indices (1, 1, rows, tiles), listed first
        order = torch.argsort((~tiles).to(torch.int8), dim=-1, stable=True)
        return tiles.sum(-1).int()[None, None], order.int()[None, None]

    def mask_mod(b, h, q, kv):
        return visible(rule, s, q, kv)

    return module.BlockMask.from_kv_blocks(*by_row(partial), *by_row(every), BLOCK_SIZE=BLOCK, mask_mod=mask_mod,
                                           seq_lengths=(s.n, s.length))


@dataclass(frozen=True)
class KernelInputs:
    """What one call's kernel reads: the queries, the slots' keys and values, and the score_mod's tensors."""

    q: Tensor  # (B, H, n, D)
    k: Tensor  # (B, H, L, D)
    v: Tensor  # (B, H, L, D)
    bias: Tensor | None  # (w + ext,) the T5 bias by distance i − j, scaled by s
    rows: Tensor | None  # (B, H, n) int32: the dropout mask's row keys (None: no dropout)
    keys: Tensor | None  # (L,) int32: the dropout mask's key keys of every slot


def slot_mask_keys(t: Tiling, s: SlotLayout, device) -> Tensor:
    """(L,) int32: the dropout mask's key of every slot: token j by its position, the summary of chunk
    r as −1 − r, a moved copy of sink token j as j (evalm/dropout_mask.py); padding as 0 (never seen)."""
    ids = torch.zeros(s.length, dtype=torch.long, device=device)
    ids[: s.n] = torch.arange(s.n, device=device)
    ids[s.remote : s.remote + s.chunks] = dropout_mask.chunk_key(t.first_chunk + torch.arange(s.chunks, device=device))
    if s.copies:
        ids[s.moved : s.moved + s.copies] = torch.arange(s.copies, device=device) % t.sink
    return dropout_mask.key_keys(ids)


def dropout_operands(t: Tiling, s: SlotLayout, q: Tensor) -> tuple[Tensor, Tensor]:
    """The row keys (B, H, n) and slot keys (L,) of the call's dropout mask (seed t.seed)."""
    B, H, n, _ = q.shape
    dev = q.device
    rows = dropout_mask.row_keys(t.seed, torch.arange(B, device=dev).view(B, 1, 1), torch.arange(H, device=dev).view(1, H, 1),
                                 torch.arange(n, device=dev))
    return rows, slot_mask_keys(t, s, dev)


def score_mod(rule: Tiling, x: KernelInputs, dropout: float):
    """The kernel's score_mod: the T5 bias on local keys; with dropout > 0, −inf on dropped keys.
    It closes over ints, bools and tensors only: a float would be traced as a symbol (an unbacked
    one in the backward's graph, which fails to trace)."""
    bias, rows, keys = x.bias, x.rows, x.keys
    cut, drop = dropout_mask.cut(dropout), dropout > 0

    def modify(score, b, h, q, kv):
        if bias is not None:
            local = (kv <= q) & (kv >= rule.window_start(q))
            score = torch.where(local, score + bias[(q - kv).clamp(0, bias.shape[0] - 1)], score)
        if drop:
            kept = dropout_mask.scramble(rows[b, h, q] ^ keys[kv]) >= cut
            score = torch.where(kept, score, float("-inf"))
        return score

    return modify


def attend_slots(t: Tiling, s: SlotLayout, x: KernelInputs, dropout: float, kernel, lse: bool = True) -> tuple[Tensor, Tensor | None]:
    """o (B, H, n, D) and, with `lse`, ℓ (B, H, n) of one `kernel` call over the slots (−inf where
    every key is dropped)."""
    _, aux = flex_kernel.module()
    rule = rule_of(t)
    kwargs = ({"return_aux": aux(lse=True)} if aux is not None else {"return_lse": True}) if lse else {}
    with torch.autocast(x.q.device.type, enabled=False):
        got = kernel(x.q, x.k, x.v, score_mod=score_mod(rule, x, dropout),
                     block_mask=block_mask(rule, s, x.q.device), scale=t.scale, **kwargs)
    if not lse:
        return got, None
    out, extra = got
    return out, extra.lse if aux is not None else extra


def attend(t: Tiling, s: SlotLayout, x: KernelInputs, kernel=None) -> Tensor:
    """EVA of the queries x.q (B, H, n, D) over the slots' keys and values x.k, x.v (B, H, L, D) ->
    (B, n, H, D), with attention dropout at t.dropout (module docstring; `x` without the dropout
    mask's keys, which are drawn here). `kernel`: flex_attention as called (default: compiled on
    CUDA, the eager reference elsewhere)."""
    kernel = kernel or flex_kernel.for_device(x.q.device)
    if t.dropout == 0:
        out, _ = attend_slots(t, s, x, 0.0, kernel, lse=False)
        return out.transpose(1, 2)
    rows, keys = dropout_operands(t, s, x.q)
    x = dataclasses.replace(x, rows=rows, keys=keys)
    kept_out, kept_lse = attend_slots(t, s, x, t.dropout, kernel)
    _, lse = attend_slots(t, s, x, 0.0, kernel)
    factor = (kept_lse - lse).exp() * dropout_mask.scale(t.dropout)  # a row that kept nothing: 0
    return (upcast(kept_out) * factor.unsqueeze(-1)).to(x.q.dtype).transpose(1, 2)


def n_copies(t: Tiling, n: int, moved: bool) -> int:
    """nb·S moved sink slots for n tokens (0 without a sink or without a move)."""
    return math.ceil(n / t.window) * t.sink if moved and t.sink else 0


class LayerParts(NamedTuple):
    """What the route reads of an EVA layer besides its call's `Tiling`."""

    t: Tiling
    maps: AdaptiveMaps  # A_q, A_k of the chunk summaries
    bias: nn.Module | None  # the T5 bias of key distances (unscaled), or None
    sink_shift: Callable[[Tensor, Tensor], Tensor] | None  # moves sink keys by a position shift (None: in place)


def attend_layer(layer: LayerParts, q: Tensor, k: Tensor, v: Tensor, kernel=None) -> Tensor:
    """EVA of one layer's heads q, k, v (B, n, H, D) -> (B, n, H, D): the slots' keys and values
    (`slot_tensors`: the chunk summaries from first_chunk on, block b's sink copy moved by
    window_start(b·w) − S as evalm/tiles.py moves it), the T5 bias by distance i − j < w + ext, then
    one `attend`. `slot_tensors` runs eagerly everywhere, a compiled block included (`_eager_slot_tensors`).

    Lengths are bucketed: q, k, v are padded with zero rows to n′ = ⌈n/128⌉·128 and the output cut back
    to n, so every length of a bucket runs one compiled kernel and one block mask (dynamic=False would
    otherwise compile one per length). Exact, by causality: a real row sees no slot past itself, so
    neither the padded tokens nor the summaries and sink copies of padded chunks and blocks, and the
    padded rows' outputs are dropped (no gradient flows from them)."""
    t, n_real = layer.t, q.shape[1]
    n = _up(n_real)
    if n != n_real:
        q, k, v = (F.pad(x, (0, 0, 0, 0, 0, n - n_real)) for x in (q, k, v))
    first, m = t.first_chunk, max(0, n // t.chunk - t.first_chunk)
    maps = (summaries.MapTensors.of(layer.maps.mu_q), summaries.MapTensors.of(layer.maps.mu_k))
    bias = None
    if layer.bias is not None:
        bias = upcast(t.scale * layer.bias(torch.arange(t.window + t.ext, device=q.device)).to(q.dtype))
    copies = n_copies(t, n, layer.sink_shift is not None)
    moved = None
    if copies:
        sink_k, sink_v = (F.pad(x[:, : t.sink], (0, 0, 0, 0, 0, t.sink - min(n, t.sink))).transpose(1, 2)
                          for x in (k, v))  # (B, H, S, D); zero rows past n are never visible
        blocks = copies // t.sink
        shift = (t.window_start(torch.arange(blocks, device=q.device) * t.window) - t.sink).view(1, 1, blocks, 1)
        moved = (layer.sink_shift(sink_k.unsqueeze(2), shift).flatten(2, 3),  # (B, H, nb·S, D)
                 sink_v.unsqueeze(2).expand(-1, -1, blocks, -1, -1).flatten(2, 3))
    s = SlotLayout(n, m, t.sink, copies)
    noise = None if t.noise_seed is None else (t.noise_seed, max(0, n_real // t.chunk - first))  # ε of the real chunks
    k_slots, v_slots = _eager_slot_tensors(maps, (q, k, v), noise, moved, (first, m, t.chunk, s.remote, s.moved, s.length), t.scale)
    return attend(t, s, KernelInputs(q.transpose(1, 2), k_slots, v_slots, bias, None, None), kernel)[:, :n_real]


def slot_tensors(maps, heads: tuple[Tensor, Tensor, Tensor], eps: Tensor | None,
                 moved: tuple[Tensor, Tensor] | None, shape: tuple[int, ...], scale: float) -> tuple[Tensor, Tensor]:
    """The slots' keys and values (B, H, L, D) of a layer's `heads` q, k, v (B, n, H, D) (module
    docstring): token rows, the summaries of chunks first … first + m − 1 (`summaries.batched`), the
    moved sink copies; zeros between. `shape` = (first, m, c, R, Z, L), plain ints."""
    _, k, v = heads
    first, m, c, remote, moved_at, length = shape
    k_tilde, beta = summaries.batched(maps, heads, (first, m, c), scale, eps)
    out = []
    for rows, summary, copy in ((k, k_tilde, moved[0] if moved else None), (v, beta, moved[1] if moved else None)):
        B, n, H, D = rows.shape
        parts = [rows.transpose(1, 2), rows.new_zeros(B, H, remote - n, D), summary.to(rows.dtype),
                 rows.new_zeros(B, H, moved_at - remote - m, D)]
        if copy is not None:
            parts += [copy.to(rows.dtype), rows.new_zeros(B, H, length - moved_at - copy.shape[2], D)]
        out.append(torch.cat(parts, 2))
    return out[0], out[1]


@untraced
def _eager_slot_tensors(maps, heads: tuple[Tensor, Tensor, Tensor], noise: tuple[int, int] | None,
                        moved: tuple[Tensor, Tensor] | None, shape: tuple[int, ...], scale: float) -> tuple[Tensor, Tensor]:
    """`slot_tensors`, never compiled, also inside a compiled block (a graph break there). Inductor's CUDA
    code for its backward (torch 2.11, H200) gave wrong gradients of q, k and the maps at 300 tokens
    (75 chunks; up to 140% of their norm) and right ones at 384, while its forward and the compiled
    flex kernel were exact: docs/runs/2026-11-29-2468550-slots-diagnosis.json. Its work is O(n·D),
    small beside the attention's; the launches it saves are not worth a wrong gradient. ε is drawn here
    as every path draws it (a generator cannot be traced): `noise` = (seed, the real chunks'
    count), zeros for a padded length's further chunks (never visible)."""
    eps = None
    if noise is not None:
        (seed, real), (B, _, H, D) = noise, heads[0].shape
        eps = summaries.noise(seed, heads[0].new_empty(B, H, real, D, dtype=maps[0].weight.dtype))
        eps = F.pad(eps, (0, 0, 0, shape[1] - real))
    return slot_tensors(maps, heads, eps, moved, shape, scale)
