"""EVA's visibility rule and the static description of one attention call.

The rule, for the query at absolute position i (docs/eva.md, "The closed form"):
  local keys   j with window_start(i) ≤ j ≤ i,   window_start(i) = max(0, ⌊i/w⌋·w − ext)
  remote keys  chunks r < chunk_limit(i),       chunk_limit(i) = ⌊i/c⌋, or ⌊window_start(i)/c⌋
                                                 with exclude_window_chunks (no chunk counted twice)
  sink keys    j < min(S, window_start(i))      with S = sink_tokens > 0: the first S tokens stay exact
                                                 keys of every later query, and their S/c chunks have
                                                 no summary (remote chunks start at r = S/c)
Every path of EVA (evalm/eva_paths.py lists them) asks `Tiling` for these numbers (and the
fused and plain paths for `local_mask`, the same rule as one block's mask); none writes the rule again.

Component ablations at evaluation time (`Ablation`, `evalm eval recall --eva-ablation`) change the
rule here, so every path honours them: `no-remote` sees no chunk (limit 0: the window alone, the
recall study's window-only control on EVA's own weights); `chunk-window` cuts the local keys to the
query's own chunk, window_start(i) = ⌊i/c⌋·c, and lets the summaries carry every earlier chunk,
limit(i) = ⌊i/c⌋. The block geometry (w, ext) stays, so caches, tiles and kernels are unchanged. `EvaAttention` builds one `Tiling` per call (its dropout and noise seeds
included) and hands it to whichever path runs the call.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
from torch import Tensor

from evalm.eva_settings import ABLATIONS

GROUP_LOGITS = 1 << 18  # logits per group (B·H·rows·keys, 1 MiB in fp32): bounds the working set and backward's temporaries


Ablation = enum.Enum("Ablation", {name.upper().replace("-", "_"): name for name in ABLATIONS},
                     module=__name__, qualname="Ablation")
"""Which branch of EVA's one softmax an evaluation switches (NONE, NO_REMOTE, CHUNK_WINDOW); the value is the
flag's spelling, declared once as `eva_settings.EvaAblation`."""


@dataclass(frozen=True)
class Tiling:
    """The static shape of one EVA attention call."""

    window: int  # w
    chunk: int  # c
    ext: int  # 0, or w with overlap_window
    exclude_window_chunks: bool
    scale: float  # s = D^-1/2
    dropout: float = 0.0  # attention dropout on the joint probabilities (0 outside training)
    seed: int = 0  # the dropout mask's seed: keep decisions are a hash of it and the logit's indices (evalm/dropout_mask.py)
    group_logits: int = GROUP_LOGITS
    noise_seed: int | None = None  # training noise ε of the chunk summaries, replayed in backward (None: no ε)
    ablation: Ablation = Ablation.NONE  # an evaluation-time component ablation (module docstring)
    sink: int = 0  # S: sink tokens, a multiple of c (module docstring; 0: none)
    select: int = 0  # k: chunks each query reads exactly by its summaries' scores (evalm/selection.py; 0: none)
    select_only: bool = False  # with select: no summary enters the softmax; they only score
    select_group: int = 1  # query heads sharing one K/V head, and so one choice (a grouped-query host's)
    select_by: str = "summary"  # what ranks the candidates: the summaries' logits, or Quest's bound ("bound", "window-bound")

    @classmethod
    def of(cls, settings, head_dim: int, ablation: Ablation = Ablation.NONE) -> Tiling:
        """The rule of EVA layers with `settings` (an `EvaSettings`, evalm/eva_settings.py: window, chunk,
        overlap, excluded window chunks, sink tokens) on heads of size `head_dim` (s = head_dim^-1/2)."""
        return cls(settings.window_size, settings.chunk_size, settings.window_size if settings.overlap_window else 0,
                   settings.exclude_window_chunks, head_dim**-0.5, sink=settings.sink_tokens, ablation=ablation,
                   select=settings.select_chunks, select_only=settings.select_only,
                   select_by=settings.select_by)

    @property
    def by_bound(self) -> bool:
        """Whether Quest's bound ranks the candidates ("bound", "window-bound"), so each summarised chunk keeps its
        key minima and maxima beside its summary (evalm/selection.py)."""
        return self.select_by in ("bound", "window-bound")

    def window_start(self, pos: Tensor | int) -> Tensor | int:
        """First local key of the query at `pos`: its block's start, less ext, at least 0 (chunk-window:
        its chunk's start)."""
        if self.ablation is Ablation.CHUNK_WINDOW:
            return pos // self.chunk * self.chunk
        start = pos // self.window * self.window - self.ext
        return start.clamp(min=0) if isinstance(start, Tensor) else max(0, start)

    def limit(self, pos: Tensor | int) -> Tensor | int:
        """Remote chunks visible to the query at `pos`: r < limit (no-remote: none)."""
        if self.ablation is Ablation.NO_REMOTE:
            return pos * 0
        if self.exclude_window_chunks:  # chunk-window: its window starts at ⌊pos/c⌋·c, so this is ⌊pos/c⌋ too
            return self.window_start(pos) // self.chunk
        return pos // self.chunk

    @property
    def first_chunk(self) -> int:
        """The first chunk with a summary: the S/c chunks before it are sink tokens."""
        return self.sink // self.chunk

    def summarized(self, n: int) -> int:
        """Chunks with a summary after n tokens: the completed ones from first_chunk on."""
        return max(0, n // self.chunk - self.first_chunk)

    def sink_count(self, pos: Tensor | int) -> Tensor | int:
        """Sink tokens the query at `pos` reads as sink keys, j < min(S, window_start(pos)): those
        of its own window are local keys already (no key counted twice)."""
        start = self.window_start(pos)
        return start.clamp(max=self.sink) if isinstance(start, Tensor) else min(self.sink, start)

    def remote_count(self, pos: Tensor | int) -> Tensor | int:
        """Summaries the query at `pos` reads: chunks first_chunk … limit(pos) − 1, the first
        remote_count(pos) of a cache's summaries (which start at chunk first_chunk)."""
        n = self.limit(pos) - self.first_chunk
        return n.clamp(min=0) if isinstance(n, Tensor) else max(0, n)

    def candidate_count(self, pos: Tensor | int) -> Tensor | int:
        """Summaries the query at `pos` may select (evalm/selection.py): the visible ones whose tokens lie wholly
        before its window, the first candidate_count(pos) of a cache's summaries. A chunk inside the window is
        read exactly already; selecting it would count its tokens twice."""
        n = self.window_start(pos) // self.chunk
        n = torch.minimum(n, self.limit(pos)) if isinstance(n, Tensor) else min(n, self.limit(pos))
        n = n - self.first_chunk
        return n.clamp(min=0) if isinstance(n, Tensor) else max(0, n)

    def mean_keys(self, n: int) -> float:
        """Keys a query reads on average over a whole sequence of n tokens: its local block, sink keys
        and visible summaries (the work of attention per query, for FLOP counts)."""
        pos = torch.arange(n)
        keys = pos - self.window_start(pos) + 1 + self.sink_count(pos) + self.remote_count(pos)
        if self.select:  # the selected chunks' tokens replace their summaries (select_only: every summary goes)
            picked = self.candidate_count(pos).clamp(max=self.select)
            keys = keys + picked * self.chunk - (self.remote_count(pos) if self.select_only else picked)
        return float(keys.double().mean()) if n else 0.0

    def local_mask(self, bias: Tensor | None, device, dtype) -> Tensor:
        """Additive (w, ext + w) mask of one block, the same for every block: the T5 bias where
        visible, −inf after the query (causal) and, with chunk-window, before the query's chunk (c
        divides w, so a row's chunk starts at the same column in every block). Column j is the key
        at block start − ext + j."""
        w = self.window
        rows, cols = torch.arange(w, device=device)[:, None], torch.arange(self.ext + w, device=device)
        base = bias.to(dtype) if bias is not None else torch.zeros(w, self.ext + w, dtype=dtype, device=device)
        hidden = cols > rows + self.ext
        if self.ablation is Ablation.CHUNK_WINDOW:
            hidden = hidden | (cols < rows // self.chunk * self.chunk + self.ext)
        return base.masked_fill(hidden, float("-inf"))

    def plain_causal(self, bias: Tensor | None) -> bool:
        """Whether one block's mask is plain causality (the fused kernel's own): no T5 bias, no
        overlap, the whole block visible."""
        return bias is None and self.ext == 0 and self.ablation is not Ablation.CHUNK_WINDOW
