"""Which implementation of EVA's one equation a call takes: `choose`, the one place that decides.

All paths compute the same joint softmax over a query's local block and the chunk summaries it
may see (docs/eva.md, "The closed form"); they differ in memory, speed and what they support:

  fused        a whole sequence (training, one-shot scoring) on PyTorch's fused CPU attention
               kernel, three parts merged by log-sum-exp; backward recomputes; attention dropout
               as −inf in the kernel's mask, one hashed mask per query row (evalm/flash.py)
  recompute    the same whole sequence in plain PyTorch ops, backward recomputes: tensors the
               CPU kernel does not take (evalm/recompute.py); the same dropout mask
  tiles        query tiles over a cache's entries, one additive mask per tile group and
               `F.scaled_dot_product_attention`, autograd's own backward (evalm/eva.py, `_attend`)
  tiles-split  the same tiles without a graph, each key set softmaxed apart and joined by one max
               and one sum, so thousands of cached summaries are never concatenated (evalm/joint_softmax.py)
  forks        a batch of forks scoring short inputs over one shared parent: their rows folded
               into one query block, so the parent's entries are read once (`_attend_folded`)
  forks-split  the same without a graph, by the split softmax

`evalm --debug` prints each layer's path and reason the first time it is taken. Tests pin a path
by changing the facts `choose` reads (tests/evalm/paths.py), never by a switch on the module.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from evalm.config_toolkit import debug

WHOLE = ("fused", "recompute")  # the paths that take a whole sequence without a cache


@dataclass(frozen=True)
class EvaCall:
    """The facts about one `EvaAttention.forward` call that decide its path."""

    whole: bool  # no cache: the whole sequence at once
    kernel: bool  # PyTorch's fused CPU kernel works in this torch and takes these tensors
    dropout: bool  # attention dropout acts (training with attn_dropout > 0)
    grad: bool  # autograd records the call
    full_precision: bool  # fp32 or fp64 queries (the split softmax has no low-precision accumulation)
    one_tile_per_group: bool  # every tile group holds one tile (a short segment, or a huge key set)
    forks: bool  # several sequences over one shared parent's entries, in one tile


@dataclass(frozen=True)
class EvaPath:
    """A path's name (one of the module docstring's) and why it was taken."""

    name: str
    reason: str


def choose(call: EvaCall) -> EvaPath:
    """The path of a call: the whole-sequence kernel where it applies (with or without attention
    dropout), else the plain recompute; with a cache, tiles, folded forks, and the split softmax
    where no graph or dropout needs the mask."""
    if call.whole:
        if call.kernel:
            why = "; attention dropout as −inf in its mask, regenerated in backward" if call.dropout else ""
            return EvaPath("fused", f"a whole sequence, and the fused CPU kernel applies{why}")
        return EvaPath("recompute", "a whole sequence; the fused CPU kernel does not take these tensors")
    split = call.one_tile_per_group and not call.grad and not call.dropout and call.full_precision
    base = "forks" if call.forks else "tiles"
    if split:
        return EvaPath(f"{base}-split", "no graph or dropout needs one mask; one tile per group: the summaries are not copied")
    return EvaPath(base, "a cache's entries" + (", forks over one parent" if call.forks else ""))


_REPORTED: set[tuple[int, str]] = set()


def report(layer: int, path: EvaPath) -> None:
    """Under `evalm --debug`, one stderr line the first time a layer takes a path."""
    if debug() and (layer, path.name) not in _REPORTED:
        _REPORTED.add((layer, path.name))
        print(f"evalm: EVA layer {layer}: path {path.name} ({path.reason})", file=sys.stderr)
