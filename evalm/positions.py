"""Circular positional embedding (EVALM §3.1): token i uses row i mod M of a learned table.

i is the absolute index since the start of the context (demonstrations, cached prefix and test
tokens all count, EVA_SPEC §3), so a cache carries its position and new tokens continue from it.
Rows start at 0: metaseq's padding offset of 2 is dropped (matters only when converting OPT weights).
"""

from __future__ import annotations

import torch
from torch import nn


def circular_positions(start: int, length: int, period: int, device=None) -> torch.Tensor:
    """Rows of the position table for absolute positions start .. start+length-1: (T,) long."""
    return torch.arange(start, start + length, device=device) % period


class CircularPositionalEmbedding(nn.Module):
    """A learned (M, E) table indexed by position mod M; never runs out of rows."""

    def __init__(self, period: int, d_model: int):
        super().__init__()
        self.period = period
        self.weight = nn.Parameter(torch.empty(period, d_model))  # (M, E)

    def forward(self, start: int, length: int) -> torch.Tensor:
        """(T, E) embeddings of positions start .. start+length-1."""
        return self.weight[circular_positions(start, length, self.period, self.weight.device)]
