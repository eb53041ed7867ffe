"""Which implementation of EVA's one equation a call takes: `choose`, the one place that decides.

All paths compute the same joint softmax over a query's local block and the chunk summaries it
may see (docs/eva.md, "The closed form"); they differ in memory, speed and what they support:

  flex         a whole sequence on a GPU: one compiled `flex_attention` call per layer over the
               tokens, the chunk summaries and the sink keys with a block mask from the rule;
               autograd's backward (the kernel's own); attention dropout as −inf in its score_mod
               (evalm/flex.py); sink tokens included, moved or not
  fused        a whole sequence (training, one-shot scoring) on PyTorch's fused CPU attention
               kernel, three parts merged by log-sum-exp; backward recomputes; attention dropout
               as −inf in the kernel's mask (evalm/flash.py, evalm/flash_sweep.py, evalm/flash_dropout.py);
               selection without dropout, sink or moved tokens: the unchosen summaries masked per
               query, the chosen tokens a written-out fourth part (evalm/flash_selection.py)
  recompute    the same whole sequence in plain PyTorch ops, backward recomputes: tensors neither
               kernel takes (float64 or a head dimension below 16 on a GPU; evalm/recompute.py)
  tiles        query tiles over a cache's entries, one additive mask per tile group and
               `F.scaled_dot_product_attention` (with attention dropout, the same softmax written
               out), autograd's own backward (evalm/tiles.py); also whole sequences with sink
               tokens, which the fused and plain paths do not read, and the calls with selection
               (`select_chunks`: a key set per query, gathered; evalm/selection.py) the fused path
               does not take, on any device
  tiles-split  the same tiles without a graph, each key set softmaxed apart and joined by one max
               and one sum, so thousands of cached summaries are never concatenated (evalm/joint_softmax.py)
  forks        a batch of forks scoring short inputs over one shared parent: their rows folded
               into one query block, so the parent's entries are read once (evalm/tiles.py)
  forks-split  the same without a graph, by the split softmax
  tiles-kernel selection without a graph or dropout over KERNEL_ROWS new tokens or more (forks-kernel
               for forks): the shared key sets (window, sink, merged prefix) on the fused CPU kernel with
               their log-sum-exp, the summaries and each query's chosen tokens written out, the parts
               joined by log-sum-exp (evalm/tile_selection.py)
Every path that drops draws the one hashed attention dropout mask (evalm/dropout_mask.py).

A path is an `EvaPath` value: its `Route` (an enum), whether it splits the softmax and whether selection's
shared key sets go to the kernel, with the reason it was taken. `EvaAttention` runs it by those fields; nothing
reads its printed name. `evalm --debug` prints each layer's path and reason the first time that layer takes it. Tests pin a path
by changing the facts `choose` reads (tests/evalm/paths.py), never by a switch on the module.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass

from evalm.config_toolkit import debug


KERNEL_ROWS = 128
"""Fewest new tokens for which selection hands its shared key sets to the fused kernel: below it (a test item, a
decoded token) the kernel's call costs more than it saves (a forked test item of 12 tokens: ~7% slower on it)."""


class Route(enum.Enum):
    """How a call's queries meet their keys; the value is the name `--debug` prints."""

    FLEX = "flex"  # a whole sequence on a GPU: one flex_attention call (evalm/flex.py)
    FUSED = "fused"  # a whole sequence on the fused CPU kernel (evalm/whole_sequence.py, FUSED)
    RECOMPUTE = "recompute"  # a whole sequence in plain PyTorch ops (evalm/whole_sequence.py, PLAIN)
    TILES = "tiles"  # query tiles over a cache's entries (evalm/tiles.py)
    FORKS = "forks"  # forks' rows folded into one block over their parent's entries (evalm/tiles.py)

    @property
    def whole(self) -> bool:
        """A whole sequence at once, without a cache."""
        return self in (Route.FLEX, Route.FUSED, Route.RECOMPUTE)


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
    sink: bool = False  # the layer keeps sink tokens (`Tiling.sink`): the flex route and the tiles read them
    flex: bool = False  # flex_attention compiles for these tensors (a GPU; evalm/flex.py `usable_on`)
    select: bool = False  # the layer selects chunks (`Tiling.select`): each query reads its own chosen tokens
    select_moved: bool = False  # the chosen tokens are moved before the window (a rotary host's `select_shift`)
    new_tokens: int = 0  # tokens of the call per sequence (T)


@dataclass(frozen=True)
class EvaPath:
    """The path a call takes, and why."""

    route: Route
    reason: str
    split: bool = False  # the split softmax (evalm/joint_softmax.py): no graph, no dropout, one tile per group
    kernel: bool = False  # selection with the shared key sets on the fused CPU kernel (evalm/tile_selection.py)

    @property
    def name(self) -> str:
        """The name the module docstring and `--debug` use."""
        return self.route.value + ("-split" if self.split else "") + ("-kernel" if self.kernel else "")


def choose(call: EvaCall) -> EvaPath:
    """The path of a call: a whole sequence on the GPU's flex_attention, else on the fused CPU kernel
    where it applies (with or without attention dropout), else the plain recompute; with a cache,
    tiles, folded forks, and the split softmax where no graph or dropout needs the mask."""
    if call.select:  # a per-query set of keys (evalm/selection.py)
        if call.whole and call.kernel and not call.dropout and not call.sink and not call.select_moved:
            return EvaPath(Route.FUSED, "a whole sequence with selection on the fused CPU kernel: the window and the "
                                        "unchosen summaries as EVA's parts, each query's chosen tokens written out, "
                                        "merged by log-sum-exp; backward recomputes")
        route = Route.FORKS if call.forks and not call.whole else Route.TILES
        if call.kernel and not call.grad and not call.dropout and call.full_precision and call.new_tokens >= KERNEL_ROWS:
            return EvaPath(route, "selection without a graph or dropout: each query's chosen tokens gathered, its "
                                  "window, sink and merged keys on the fused CPU kernel, joined by log-sum-exp", kernel=True)
        return EvaPath(route, "selection: each query's chosen chunks' tokens, gathered per query, read by the tiles "
                              "(autograd's backward) where the fused path does not apply: a cache, sink tokens, "
                              "attention dropout, moved tokens, or no fused CPU kernel (no flex form yet)")
    if call.whole and call.flex:
        why = "; attention dropout as −inf in its score_mod, renormalised by the undropped log-sum-exp" if call.dropout else ""
        return EvaPath(Route.FLEX, "a whole sequence on a GPU: one compiled flex_attention call over tokens, "
                                   f"summaries{' and sink keys' if call.sink else ''} with the rule's block mask{why}")
    if call.whole and call.sink:  # the fused and plain kernels split a sequence into blocks and chunks only
        return EvaPath(Route.TILES, "a whole sequence with sink tokens, which only the tiles read (autograd's backward)")
    if call.whole:
        if call.kernel:
            why = "; attention dropout as −inf in its mask, regenerated in backward" if call.dropout else ""
            return EvaPath(Route.FUSED, f"a whole sequence, and the fused CPU kernel applies{why}")
        return EvaPath(Route.RECOMPUTE, "a whole sequence; the fused CPU kernel does not take these tensors")
    route = Route.FORKS if call.forks else Route.TILES
    if call.one_tile_per_group and not call.grad and not call.dropout and call.full_precision:
        return EvaPath(route, "no graph or dropout needs one mask; one tile per group: the summaries are not copied", split=True)
    return EvaPath(route, "a cache's entries" + (", forks over one parent" if call.forks else ""))


def report(layer: int, path: EvaPath, reported: set[str]) -> None:
    """Under `evalm --debug`, one stderr line the first time a layer takes a path; `reported` is the
    layer's own record of the paths it has named (no state shared between models)."""
    if debug() and path.name not in reported:
        reported.add(path.name)
        print(f"evalm: EVA layer {layer}: path {path.name} ({path.reason})", file=sys.stderr)
