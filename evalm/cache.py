"""The incremental-encoding cache (EVALM Algorithm 1, docs/model.md).

A `Cache` owns the position (`n_seen`, nanochat's KVCache) and one state per layer, a
`LayerState` defined by the layer's attention variant (declared below). For EVA a layer's state is exactly what the next token can attend to: the window K/V of the current block,
the queries of the incomplete chunk, and one compressed (key, value) pair per completed chunk, so
after n tokens a layer holds n // chunk_size remote entries, at most ext + window_size window rows
and fewer than chunk_size pending queries: memory linear in n and chunk_size times smaller than a
full K/V cache (`EvaState`, evalm/eva.py). For full attention the state is the plain K/V
(`FullState`, evalm/full_attention.py).

States are never mutated in place: an update builds new tensors, so `fork()` is a shallow copy
and a child can never change its parent. Long, shared tensors are kept as tuples of parts so a
batch of forks broadcasts the parent's batch-1 parts instead of copying them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

Parts = tuple[Tensor, ...]


def parts_len(parts: Parts) -> int:
    return sum(p.shape[-2] for p in parts)


def parts_head(parts: Parts, n: int) -> Parts:
    """The first n rows (along dim -2) of a tuple of parts, as views."""
    out = []
    for p in parts:
        if n <= 0:
            break
        out.append(p[..., :n, :])
        n -= p.shape[-2]
    return tuple(out)


def parts_append(parts: Parts, new: Tensor, n_owned: int) -> tuple[Parts, int]:
    """Append rows; merge into the last part only if this cache owns it (never copy a parent's)."""
    if new.shape[-2] == 0:
        return parts, n_owned
    if n_owned and parts[-1].shape[0] == new.shape[0]:
        return parts[:-1] + (torch.cat([parts[-1], new], dim=-2),), n_owned
    return parts + (new,), n_owned + 1


def parts_bytes(parts: Parts) -> int:
    return sum(p.numel() * p.element_size() for p in parts)


FIRST_PAGE_ROWS, PAGE_ROWS = 256, 16384
"""The pages of `Rows`: the first of 256 rows (or the first append's), each next one twice the last, up to 16,384
rows: a reader gathers from a few pages (six for 20k rows), a short cache holds little spare room."""


@dataclass(frozen=True)
class Rows:
    """Rows (B, H, n, D) growing along dim −2 without ever being copied: full pages (parts, shared with a fork's
    parent), then a page this state fills in place. Pages double from `FIRST_PAGE_ROWS` up to `PAGE_ROWS` rows,
    so a reader gathers from few pages and a long cache wastes at most one page's spare room (a cache that reads thousands of
    demonstrations one at a time would copy all of its rows at every call if each append concatenated).

    Writing into a page's spare rows changes no row any state can see (each sees rows < its own n), so the
    states stay immutable to their readers. `mark` is the page's high-water mark, shared by the states over
    it: only the state at the mark writes in place; an older state that grows again (a branch taken without
    `Cache.fork`) starts a page of its own. Under autograd an append concatenates."""

    parts: Parts = ()
    buffer: Tensor | None = None  # (B, H, capacity, D): rows < n are this state's
    n: int = 0
    mark: list[int] = dataclasses.field(default_factory=lambda: [0], compare=False)

    def __len__(self) -> int:
        return parts_len(self.parts) + self.n

    def append(self, new: Tensor) -> Rows:
        m, buffer, n = new.shape[-2], self.buffer, self.n
        if m == 0:
            return self
        if buffer is not None and buffer.shape[0] != new.shape[0]:  # a batch of forks grows rows of its own
            return Rows(self.parts + (buffer[..., :n, :],)).append(new)
        if torch.is_grad_enabled() and (new.requires_grad or buffer is not None and buffer.requires_grad):
            grown = new if buffer is None else torch.cat([buffer[..., :n, :], new], -2)
            return Rows(self.parts, grown, grown.shape[-2], [grown.shape[-2]])
        parts, mark = self.parts, self.mark
        if buffer is None or n + m > buffer.shape[-2] or mark[0] != n:  # a new page; the last one, if any, is kept
            size = max(m, min(PAGE_ROWS, 2 * buffer.shape[-2] if buffer is not None else FIRST_PAGE_ROWS))
            parts = parts + ((buffer[..., :n, :],) if n else ())
            buffer, n, mark = new.new_empty(*new.shape[:-2], size, new.shape[-1]), 0, [0]
        buffer[..., n : n + m, :] = new
        mark[0] = n + m
        return Rows(parts, buffer, n + m, mark)

    def disowned(self) -> Rows:
        """The rows as a fork holds them: all shared; its own appends start a page of their own."""
        return Rows(self.views())

    def views(self) -> Parts:
        """Every row, as the parts they lie in (no copy): the full pages, then this state's."""
        return self.parts + ((self.buffer[..., : self.n, :],) if self.buffer is not None and self.n else ())

    def nbytes(self) -> int:
        """Bytes held, the pages' spare room included."""
        return parts_bytes(self.parts + ((self.buffer,) if self.buffer is not None else ()))


@runtime_checkable
class LayerState(Protocol):
    """What the cache needs of one layer's state; each attention variant defines its own.

    The variant's module builds and reads its state (EVA: `EvaState` in evalm/eva.py; exact
    attention: `FullState` in evalm/full_attention.py); `Cache` stores it in `layers[i]` without
    looking inside, except through these three members. A state must be immutable: an update
    builds a new state (new tensors), never writes into the old one, because `fork` shares states
    between parent and children by reference.
    """

    def entries(self) -> tuple[Tensor, Tensor]:
        """Keys and values (B, H, K, D) that every later token of this layer attends to.

        `merge` concatenates them across caches into the prefix of Structured Prompting (Hao et
        al., Eq. 2), and SAICL training (train/structure.py) reads them as the groups' entries;
        the prefix is attended to without mask or bias, so the order along K is the state's choice.
        """
        ...

    def nbytes(self) -> int:
        """Bytes of the tensors the state holds, for `Cache.nbytes` (the memory benchmarks).

        Tensors shared with a parent count in full: each cache reports what it can reach.
        """
        ...

    def disowned(self) -> LayerState:
        """The state as a fork sees it: owning none of its tensors (`Cache.fork`).

        A state that keeps long tensors as parts grows them with `parts_append`, which concatenates
        new rows onto the last part only if this state made it (`n_owned`). A forked child that
        did so would copy the parent's part (thousands of chunk summaries) once per child; after
        `disowned` it adds new parts instead and the parent's stay shared. A state without such
        parts may return itself.
        """
        ...


class Cache:
    """Position plus per-layer states; pass it to `EvalmModel.forward(tokens, cache=cache)`.

    `position_offset` is the absolute position of the cache's first token (right-aligned groups in
    Structured Prompting); block and chunk alignment always count from the cache's start.
    `prefix` holds, per layer, entries merged from other caches that every new token attends to
    (`merge`), and `own_logit_bias` is added to the logits of this cache's own entries.

    A plain class, not a dataclass, on purpose: FSDP2 rebuilds dataclass arguments that hold
    tensors requiring grad (to hook them for backward), so under autograd each sharded block would
    update a copy and the caller's cache would miss every layer after the first (tuning under the
    SAICL mask, train/structure.py, encodes through caches with gradients).
    """

    def __init__(self, n_layer: int, batch_size: int = 1, position_offset: int = 0, n_seen: int = 0,
                 layers: list | None = None, prefix: list | None = None, own_logit_bias: float = 0.0):
        self.n_layer, self.batch_size = n_layer, batch_size
        self.position_offset, self.n_seen = position_offset, n_seen
        self.layers: list[LayerState | None] = layers or [None] * n_layer
        self.prefix = prefix or [None] * n_layer  # per layer: (k, v) (1 or B, H, P, D) or None
        self.own_logit_bias = own_logit_bias

    def get_pos(self) -> int:
        """Absolute position of the next token (drives the circular positions)."""
        return self.position_offset + self.n_seen

    def advance(self, n_tokens: int) -> None:
        self.n_seen += n_tokens

    def fork(self, batch_size: int | None = None) -> Cache:
        """An independent child; with batch_size, N children broadcast from a batch-1 parent.

        Children of a batch must be fed RIGHT-padded tokens (docs/model.md): padding after the
        real tokens never reaches them, while left padding would shift blocks, chunks, positions.
        """
        if batch_size is not None and batch_size != self.batch_size and self.batch_size != 1:
            raise ValueError(f"fork(batch_size={batch_size}) needs a batch-1 parent, not {self.batch_size}")
        layers = [s.disowned() if s is not None else None for s in self.layers]
        return Cache(self.n_layer, batch_size or self.batch_size, self.position_offset, self.n_seen, layers,
                     list(self.prefix), self.own_logit_bias)

    def nbytes(self) -> int:
        """Bytes held by the layer states and merged prefixes (shared parts counted once here)."""
        states = sum(s.nbytes() for s in self.layers if s is not None)
        return states + sum(parts_bytes(p) for p in self.prefix if p is not None)


def merge(caches: list[Cache], own_logit_bias: float = 0.0, position_offset: int | None = None) -> Cache:
    """A fresh cache whose tokens attend to the union of every group's entries plus their own.

    Structured Prompting (Hao et al., Eq. 2): groups are encoded independently; the test tokens
    attend to all groups' keys/values and to themselves, their own logits raised by log M. For
    EVA a group's entries are its window K/V plus its remote chunk summaries (docs/evaluation.md).
    """
    if not caches:
        raise ValueError("merge needs at least one cache")
    n_layer = caches[0].n_layer
    if any(c.batch_size != 1 or c.n_layer != n_layer for c in caches):
        raise ValueError("merge needs batch-1 caches of one model")
    if len(caches) == 1 and own_logit_bias == 0.0 and position_offset in (None, caches[0].get_pos()):
        # Merging one cache is that cache: new tokens continue its blocks and chunks, so one group
        # equals concat exactly for every group length (docs/evaluation.md). A fresh cache would start a
        # new block at the group's end and lose the chunk that the test tokens complete.
        return caches[0].fork()
    prefix = []
    for i in range(n_layer):
        ks, vs = [], []
        for c in caches:
            if c.prefix[i] is not None:
                ks.append(c.prefix[i][0])
                vs.append(c.prefix[i][1])
            if c.layers[i] is not None:
                k, v = c.layers[i].entries()
                ks.append(k)
                vs.append(v)
        prefix.append((torch.cat(ks, -2), torch.cat(vs, -2)) if ks else None)
    offset = max(c.get_pos() for c in caches) if position_offset is None else position_offset
    return Cache(n_layer=n_layer, position_offset=offset, prefix=prefix, own_logit_bias=own_logit_bias)
