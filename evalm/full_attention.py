"""Exact causal softmax attention: the baseline EVA is compared with, behind the same cache API.

Without a cache, one fused causal softmax; with one, the new queries attend to any merged prefix,
the cached K/V and their own causal K/V in one softmax, and the layer's state becomes the plain
K/V of every token seen (`FullState`, a `LayerState` of evalm/cache.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from evalm.cache import Cache, Parts, parts_append, parts_bytes
from evalm.heads import HeadProjections, HeadShape, upcast


@dataclass(frozen=True)
class FullState:
    """One exact-attention layer: the plain K/V of every token seen."""

    k: Parts = ()  # parts (B, H, T_i, D)
    v: Parts = ()
    n_owned: int = 0

    def entries(self) -> tuple[Tensor, Tensor]:
        return torch.cat(self.k, -2), torch.cat(self.v, -2)

    def nbytes(self) -> int:
        return parts_bytes(self.k + self.v)

    def disowned(self) -> FullState:
        return dataclasses.replace(self, n_owned=0)


class FullAttention(HeadProjections):
    """Exact causal softmax attention: the baseline, and a plain K/V cache for the shared API."""

    def __init__(self, config, layer_idx: int = 0):
        super().__init__(HeadShape.of(config), layer_idx)

    def init_weights(self) -> None:
        self.init_projections()

    def forward(self, x: Tensor, cache: Cache | None = None) -> Tensor:
        q, k, v = self.qkv(x)
        if cache is None:
            p = self.attn_dropout if self.training else 0.0
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        else:
            out = self._attend_cached(q, k, v, cache)
        return self.merge(out)

    def _attend_cached(self, q: Tensor, k: Tensor, v: Tensor, cache: Cache) -> Tensor:
        """New queries over merged prefix, cached K/V and their own causal K/V, in one softmax."""
        state = cache.layers[self.layer_idx] or FullState()
        prefix = cache.prefix[self.layer_idx]
        s, T = self.head_dim**-0.5, q.shape[-2]
        causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        own = [upcast(s * (q @ p.transpose(-1, -2))) for p in state.k]
        own.append(upcast(s * (q @ k.transpose(-1, -2))).masked_fill(~causal, float("-inf")))
        logits = [torch.cat(own, -1) + cache.own_logit_bias]
        values = [*state.v, v]
        if prefix is not None:
            logits.insert(0, upcast(s * (q @ prefix[0].transpose(-1, -2))))
            values.insert(0, prefix[1])
        probs = torch.softmax(torch.cat(logits, -1), dim=-1).to(q.dtype)
        probs = F.dropout(probs, self.attn_dropout, self.training)
        out, at = 0, 0
        for val in values:
            out = out + probs[..., at : at + val.shape[-2]] @ val
            at += val.shape[-2]
        keys, _ = parts_append(state.k, k, state.n_owned)
        vals, n_owned = parts_append(state.v, v, state.n_owned)
        cache.layers[self.layer_idx] = FullState(keys, vals, n_owned)
        return out
