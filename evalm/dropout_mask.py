"""Attention dropout's keep mask on EVA's joint probabilities: one definition, a pure function of
indices, so any tiling of the work (and an oracle) regenerates the same mask.

For the query at position i of sequence b, head h, every key it may see gets one keep decision:
  key id   a token key at position j is j; the summary of chunk r is −1 − r; the m-th entry merged
           from other caches (a cache's prefix, Structured Prompting and SAICL) is 2³⁰ + m: three
           ranges that never meet (positions and prefix entries below 2³⁰)
  keep     u(seed, b, h, i, id) ≥ p, with u a 32-bit counter-based hash read as uniform in [0, 1)
Positions count from the start of the cache a call continues (its blocks and chunks do), so i and
j are the positions `Tiling` reads. A kept probability is scaled by 1/(1 − p) (inverted dropout,
as `torch.nn.Dropout`). The decision depends on nothing but these five integers: not on which
kernel call, group, range, tile or piece of chunks computes the logit, so the forward, the
backward that recomputes the probabilities, every path of evalm/eva_paths.py (the whole-sequence
ones and the cached tiles alike) and the per-token oracle draw one mask per query row, shared by
the row's local keys, chunk summaries and prefix entries. Storing it instead would cost a bit per
logit, O(n·(w + n/c)) per head, more than EVA's whole training peak at long n.

The hash: a row key mix(seed, b, h, i) and a key mix(id) (both small tensors, 64-bit
arithmetic on 32-bit values), then per logit one xor and a multiply–xorshift–multiply round in
int32 (wrapping), whose low 31 bits are kept where they are at least ⌈p·2³¹⌉: the keep
probability is 1 − ⌈p·2³¹⌉/2³¹, p to within 2⁻³¹. `keep_of` gives the decisions as booleans (the
plain path, the oracle), `additive_of` as the 0 / −inf mask the fused kernel adds to its logits,
computed in place without a boolean or a `where`; both read the one hash.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

_M32 = 0xFFFFFFFF
# odd multipliers below 2^31, so a 32-bit value times one stays inside int64 (no signed overflow)
_MUL = (0x7FEB352D, 0x31848BAB, 0x2C1B3C6D, 0x297A2D39)
# the per-logit round in int32: the same odd constants as signed 32-bit values (products wrap)
_MUL32 = (0x7FEB352D, 0x31848BAB)


def _mix(x: Tensor) -> Tensor:
    """A 32-bit avalanche of x (int64, any value): its low 32 bits, xorshift-multiply twice."""
    x = x & _M32
    x = x ^ (x >> 16)
    x = (x * _MUL[0]) & _M32
    x = x ^ (x >> 15)
    x = (x * _MUL[1]) & _M32
    return x ^ (x >> 16)


def chunk_key(r: Tensor) -> Tensor:
    """The key id of chunk summaries r (token keys are their positions)."""
    return -1 - r


PREFIX_BASE = 1 << 30  # key ids of prefix entries start here: above every token position


def prefix_key(m: Tensor) -> Tensor:
    """The key id of the m-th entry of a merged prefix (`Cache.prefix`)."""
    return PREFIX_BASE + m


def _signed32(x: Tensor) -> Tensor:
    """int64 values in [0, 2^32) as the int32 with the same bits."""
    return torch.where(x >= 1 << 31, x - (1 << 32), x).to(torch.int32)


def row_keys(seed: int, seq: Tensor, head: Tensor, row: Tensor) -> Tensor:
    """The int32 key of each query (broadcast seq, head, row): sequence, head, absolute position."""
    key = _mix(_mix(_mix(torch.as_tensor(seed & _M32) ^ seq.long() * _MUL[2]) ^ head.long() * _MUL[3]) ^ row.long())
    return _signed32(_mix(key ^ (seed >> 32)))  # all 62 bits of the seed


def key_keys(key: Tensor) -> Tensor:
    """The int32 key of each key id (a token's position, or `chunk_key` of a chunk)."""
    return _signed32(_mix(key.long() * _MUL[2] + 0x9E3779B9))


def _hash(rows: Tensor, keys: Tensor, scratch: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """The 31-bit hash (int32, non-negative) of broadcast `row_keys` × `key_keys`: one xor, then
    multiply–xorshift–multiply in int32 (wrapping). `scratch`: two flat int32 buffers of at least
    the broadcast size to compute in (fresh tensors of a tile's size cost more than the arithmetic)."""
    if scratch is None:
        return scramble(rows ^ keys)
    shape = torch.broadcast_shapes(rows.shape, keys.shape)
    x, y = (buffer[: math.prod(shape)].view(shape) for buffer in scratch)
    torch.bitwise_xor(rows, keys, out=x)
    x.mul_(_MUL32[0])
    torch.bitwise_right_shift(x, 15, out=y)
    x.bitwise_xor_(y.bitwise_and_(0x1FFFF))  # a logical shift of the int32 bits
    x.mul_(_MUL32[1])
    return x.bitwise_and_(0x7FFFFFFF)


def scramble(x: Tensor) -> Tensor:
    """The per-logit round of `_hash` on x = row key ^ key key (int32), out of place: the form a
    fused kernel's score_mod traces (evalm/flex.py), and `_hash` without scratch buffers."""
    x = x * _MUL32[0]
    x = x ^ ((x >> 15) & 0x1FFFF)  # a logical shift of the int32 bits
    x = x * _MUL32[1]
    return x & 0x7FFFFFFF


def cut(p: float) -> int:
    """Hashes below it are dropped: ⌈p·2³¹⌉ of the 2³¹ values."""
    return math.ceil(p * (1 << 31))


def keep_of(rows: Tensor, keys: Tensor, p: float) -> Tensor:
    """The keep decisions (bool) of broadcast `row_keys` × `key_keys`."""
    return _hash(rows, keys) >= cut(p)


_NEG_INF_BITS = {torch.float32: -(1 << 23), torch.float64: -(1 << 52)}  # 0xFF800000, 0xFFF0000000000000


def additive_of(rows: Tensor, keys: Tensor, p: float, dtype: torch.dtype,
                scratch: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """The same decisions as an additive mask of `dtype` (fp32 or fp64): 0 where kept, −inf where
    dropped, in place: the sign of hash − cut, spread by an arithmetic shift over the bits of −inf.
    With `scratch`, a view of its first buffer (valid until the next call that uses it)."""
    x = _hash(rows, keys, scratch)
    if dtype == torch.float64:
        x = x.long()
    x.sub_(cut(p)).bitwise_right_shift_(8 * x.element_size() - 1)  # −1 where dropped, 0 where kept
    return x.bitwise_and_(_NEG_INF_BITS[dtype]).view(dtype)


def keep(seed: int, p: float, seq: Tensor, head: Tensor, row: Tensor, key: Tensor) -> Tensor:
    """The keep decisions (bool) of the logits at broadcast (seq, head, row) × key: seq, head and
    row index the query (sequence, head, absolute position), key the key ids (module docstring).
    The definition; a caller that draws many tiles computes `row_keys` and `key_keys` once and
    calls `keep_of` per tile, which is the same function."""
    return keep_of(row_keys(seed, seq, head, row), key_keys(key), p)


def scale(p: float) -> float:
    """The factor of a kept probability."""
    return 1.0 / (1.0 - p)
