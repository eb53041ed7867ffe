"""What every attention variant shares: the q/k/v/out projections, the head split and merge, the inits.

`EvaAttention` (evalm/eva.py) and `FullAttention` (evalm/full_attention.py) subclass
`HeadProjections`, so the parameters keep the public EVA reference's names (`q_proj`, `k_proj`,
`v_proj`, `out_proj`) in both and checkpoints of either variant load strictly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


def upcast(x: Tensor) -> Tensor:
    """Softmax inputs in at least fp32 (docs/eva.md, "Precision"); float64 stays float64 for exact tests."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


@dataclass(frozen=True)
class HeadShape:
    """The heads an attention works on: n_head heads of head_dim, and its attention dropout rate."""

    n_head: int
    head_dim: int
    attn_dropout: float = 0.0
    group: int = 1  # query heads per key/value head (a grouped-query host's; EVA's selection shares a choice over them)

    @classmethod
    def of(cls, config) -> HeadShape:
        """A `ModelConfig`'s heads."""
        return cls(config.n_head, config.head_dim, config.attn_dropout)


class HeadProjections(nn.Module):
    """Linear(E, E) projections to queries, keys and values and back, split into n_head heads
    (E = n_head · head_dim). Without `projections`, the head layout alone: EVA's parts inside a host
    module that projects its own heads (evalm/eva.py, `EvaAttention(settings, layer, heads)`)."""

    def __init__(self, shape: HeadShape, layer_idx: int = 0, projections: bool = True):
        super().__init__()
        self.layer_idx, self.n_head, self.head_dim = layer_idx, shape.n_head, shape.head_dim
        self.attn_dropout = shape.attn_dropout
        if projections:
            E = shape.n_head * shape.head_dim
            self.q_proj, self.k_proj = nn.Linear(E, E), nn.Linear(E, E)
            self.v_proj, self.out_proj = nn.Linear(E, E), nn.Linear(E, E)

    def init_projections(self, *extra: nn.Linear) -> None:
        """Inits of the EVA reference: Xavier gain 1/√2 on q/k/v (and `extra`, EVA's A_q/A_k
        linears, in this order: it fixes the RNG draws), Xavier on out_proj with a zero bias."""
        for lin in (self.q_proj, self.k_proj, self.v_proj, *extra):
            lin.reset_parameters()
            nn.init.xavier_uniform_(lin.weight, gain=2**-0.5)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    def heads(self, x: Tensor) -> Tensor:
        """(B, T, E) -> (B, H, T, D)."""
        B, T, _ = x.shape
        return x.view(B, T, self.n_head, self.head_dim).transpose(1, 2)

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values of x (B, T, E), each (B, H, T, D)."""
        return self.heads(self.q_proj(x)), self.heads(self.k_proj(x)), self.heads(self.v_proj(x))

    def merge(self, out: Tensor) -> Tensor:
        """Attention output (B, H, T, D) -> out_proj of its (B, T, E) concatenated heads."""
        B, _, T, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(B, T, -1))
