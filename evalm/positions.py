"""Circular positional embedding (EVALM §3.1): token i uses row i mod M of a learned table.

i is the absolute index since the start of the context (demonstrations, cached prefix and test
tokens all count, docs/model.md), so a cache carries its position and new tokens continue from it.
Rows start at 0: metaseq's padding offset of 2 is dropped (matters only when converting OPT weights).

`absolute_positions` is the baseline EVALM compares against (§3.1 "fledges vanilla learned
positional embedding", Figure 4's extrapolation): a plain learned table of M rows. Past its last
row the table is extended the way a user of such a model extends it without retraining, by
repeating the last learned row (position i uses row min(i, M - 1)). Tiling the table instead
would be circular positions themselves, and interpolating rows needs the test length in advance,
which incremental encoding does not know.
"""

from __future__ import annotations

import torch
from torch import nn


def circular_positions(start: int, length: int, period: int, device=None) -> torch.Tensor:
    """Rows of the position table for absolute positions start .. start+length-1: (T,) long."""
    return torch.arange(start, start + length, device=device) % period


def absolute_positions(start: int, length: int, rows: int, device=None) -> torch.Tensor:
    """Rows of a plain learned table for positions start .. start+length-1, the last row repeated past its end."""
    return torch.arange(start, start + length, device=device).clamp(max=rows - 1)


POSITION_RULES = {"circular": circular_positions, "absolute": absolute_positions}


class CircularPositionalEmbedding(nn.Module):
    """A learned (M, E) table indexed by position mod M (or, for the baseline, min(position, M - 1))."""

    def __init__(self, period: int, d_model: int, rule: str = "circular"):
        super().__init__()
        self.period = period
        self.rows = POSITION_RULES[rule]
        self.weight = nn.Parameter(torch.empty(period, d_model))  # (M, E)

    def forward(self, start: int, length: int) -> torch.Tensor:
        """(T, E) embeddings of positions start .. start+length-1."""
        return self.weight[self.rows(start, length, self.period, self.weight.device)]
