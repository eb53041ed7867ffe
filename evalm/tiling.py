"""EVA's visibility rule and the static description of one attention call.

The rule, for the query at absolute position i (docs/eva.md, "The closed form"):
  local keys   j with window_start(i) ≤ j ≤ i,   window_start(i) = max(0, ⌊i/w⌋·w − ext)
  remote keys  chunks r < chunk_limit(i),       chunk_limit(i) = ⌊i/c⌋, or ⌊window_start(i)/c⌋
                                                 with exclude_window_chunks (no chunk counted twice)
Every path of EVA (evalm/eva_paths.py lists them) asks `Tiling` for these two numbers; none
writes the rule again. `EvaAttention` builds one `Tiling` per call (its dropout and noise seeds
included) and hands it to whichever path runs the call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

GROUP_LOGITS = 1 << 18  # logits per group (B·H·rows·keys, 1 MiB in fp32): bounds the working set and backward's temporaries


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

    def window_start(self, pos: Tensor | int) -> Tensor | int:
        """First local key of the query at `pos`: its block's start, less ext, at least 0."""
        start = pos // self.window * self.window - self.ext
        return start.clamp(min=0) if isinstance(start, Tensor) else max(0, start)

    def limit(self, pos: Tensor | int) -> Tensor | int:
        """Remote chunks visible to the query at `pos`: r < limit."""
        if self.exclude_window_chunks:
            return self.window_start(pos) // self.chunk
        return pos // self.chunk

    def local_mask(self, bias: Tensor | None, device, dtype) -> Tensor:
        """Additive (w, ext + w) mask of one block, the same for every block: the T5 bias where
        visible, −inf after the query (causal). Column j is the key at block start − ext + j."""
        w = self.window
        rows, cols = torch.arange(w, device=device)[:, None], torch.arange(self.ext + w, device=device)
        base = bias.to(dtype) if bias is not None else torch.zeros(w, self.ext + w, dtype=dtype, device=device)
        return base.masked_fill(cols > rows + self.ext, float("-inf"))
