"""The static description of one EVA attention call over a whole sequence (`Tiling`).

Both training paths read it: the fused-kernel path (evalm/flash.py) and the plain-PyTorch
recomputing path (evalm/recompute.py), which also serves attention dropout.
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
    seed: int = 0  # dropout masks of group g come from a generator seeded with seed + g
    group_logits: int = GROUP_LOGITS
    fused: bool = True  # PyTorch's fused CPU attention kernel where it applies (evalm/flash.py)

    def limit(self, pos: Tensor | int):
        """Remote chunks visible to the query at `pos`: r < limit (§1.3, §1.7)."""
        if self.exclude_window_chunks:
            start = pos // self.window * self.window - self.ext
            return (start.clamp(min=0) if isinstance(start, Tensor) else max(0, start)) // self.chunk
        return pos // self.chunk

    def local_mask(self, bias: Tensor | None, device, dtype) -> Tensor:
        """Additive (w, ext + w) mask of one block, the same for every block: the T5 bias where
        visible, −inf after the query (causal). Column j is the key at block start − ext + j."""
        w = self.window
        rows, cols = torch.arange(w, device=device)[:, None], torch.arange(self.ext + w, device=device)
        base = bias.to(dtype) if bias is not None else torch.zeros(w, self.ext + w, dtype=dtype, device=device)
        return base.masked_fill(cols > rows + self.ext, float("-inf"))
