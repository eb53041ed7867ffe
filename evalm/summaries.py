"""EVA's chunk summaries: one remote key k̃_r and one remote value β_r per completed chunk r.

Every path of EVA computes them here (docs/eva.md, "Chunk summaries"):
  q̄_r, k̄_r   mean query and mean key of chunk r's c tokens              (B, H, n, D)
  k̃_r        = A_k(k̄_r), the remote key                                  (B, H, n, D)
  ω_r        = A_q(q̄_r) + k̃_r (+ ε_r ~ N(0, I) in training only)         (B, H, n, D)
  λ_rj       = s·ω_r·k_j − s·‖k_j‖²/2, for the c keys j of chunk r        (…, n, c)
  β_r        = Σ_j softmax_j(λ_r·) v_j, the remote value                  (B, H, n, D)
B sequences, H heads, n chunks of c tokens, D the head dimension, s = D^-1/2, N ≥ n·c tokens.
Causal EVA has no 0.5 in ω, and ‖k‖² is scaled by s, not s² (the public reference's choices).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from evalm.heads import upcast


class AdaptiveMaps(NamedTuple):
    """A_q and A_k (modules: the adaptive maps, shared by the heads of a layer)."""

    mu_q: nn.Module
    mu_k: nn.Module

    def parameters(self) -> list[Tensor]:
        """Their parameters, A_q's then A_k's: the order of a Function's extra inputs."""
        return [*self.mu_q.parameters(), *self.mu_k.parameters()]


def chunk_means(x: Tensor, n: int, c: int, dtype: torch.dtype | None = None) -> Tensor:
    """Means of the first n chunks of c rows of x (B, N, H, D) -> (B, H, n, D), summed in `dtype`."""
    return x[:, : n * c].unflatten(1, (n, c)).mean(2, dtype=dtype).transpose(1, 2)


def noise(seed: int, like: Tensor) -> Tensor:
    """ε ~ N(0, I) shaped like ω, from a generator seeded with `seed`: a backward that recomputes ω
    draws the very ε its forward drew."""
    generator = torch.Generator(device=like.device)
    generator.manual_seed(seed)
    return torch.randn(like.shape, generator=generator, dtype=like.dtype, device=like.device)


def keys(maps, q_mean: Tensor, k_mean: Tensor, eps: int | Tensor | None) -> tuple[Tensor, Tensor]:
    """k̃ and ω (B, H, n, D) from the chunks' mean queries and keys, in the maps' dtype. `maps`: A_q and A_k
    as modules (`AdaptiveMaps`) or as tensors (`MapTensors`, for a compiled graph); `eps`: the training
    noise ε as its seed (drawn here), as a tensor already drawn (a compiled graph traces no generator),
    or None."""
    mu_q, mu_k = maps
    k_tilde = mu_k(k_mean)
    omega = mu_q(q_mean) + k_tilde
    if eps is not None:  # one random-feature sample per chunk and head, fresh every forward
        omega = omega + (noise(eps, omega) if isinstance(eps, int) else eps)
    return k_tilde, omega


def values(k: Tensor, v: Tensor, omega: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """β (…, n, D) and the softmax weights (…, n, c) from chunk keys and values k, v (…, n, c, D)
    and ω (…, n, D): the one place λ and β are written."""
    lam = (k * (omega.unsqueeze(-2) - k / 2)).sum(-1)  # ω_r·k_j − ‖k_j‖²/2, elementwise: a fused kernel, not c-row products
    weights = torch.softmax(upcast(lam * scale), dim=-1).to(v.dtype)
    beta = (weights.unsqueeze(-1) * v).sum(-2)
    return beta, weights


class MapTensors(NamedTuple):
    """A_q or A_k as tensors: Linear(D→D), then LayerNorm(D) when `norm_weight` is given ('qk')."""

    weight: Tensor
    bias: Tensor
    norm_weight: Tensor | None
    norm_bias: Tensor | None
    eps: float

    @classmethod
    def of(cls, seq: nn.Module) -> MapTensors:
        norm = seq[1] if len(seq) > 1 else None
        return cls(seq[0].weight, seq[0].bias, norm.weight if norm else None, norm.bias if norm else None,
                   norm.eps if norm else 0.0)

    def __call__(self, x: Tensor) -> Tensor:
        y = torch.nn.functional.linear(x, self.weight, self.bias)
        if self.norm_weight is None:
            return y
        return torch.nn.functional.layer_norm(y, y.shape[-1:], self.norm_weight, self.norm_bias, self.eps)


def batched(maps: tuple[MapTensors, MapTensors], heads: tuple[Tensor, Tensor, Tensor], chunks: tuple[int, int, int],
            scale: float, eps: Tensor | None) -> tuple[Tensor, Tensor]:
    """k̃ and β (B, H, m, D) of chunks first … first + m − 1 (`chunks` = (first, m, c), c the chunk length) of
    `heads` q, k, v (B, N, H, D), every chunk and head at once, differentiable by autograd (the GPU route,
    evalm/flex.py, which compiles this into a few fused kernels). The maps come as tensors (`MapTensors`),
    so one compiled graph serves every layer; ε (B, H, m, D) as drawn by `noise`, or None. Means and λ in at
    least fp32; k̃ in the maps' dtype."""
    (q, k, v), (first, m, c) = heads, chunks

    def by_chunk(x: Tensor) -> Tensor:  # (B, m, c, H, D), a view
        return upcast(x[:, first * c : (first + m) * c].unflatten(1, (m, c)))

    dtype = maps[0].weight.dtype
    q_mean, k_mean = (by_chunk(x).mean(2).transpose(1, 2).to(dtype) for x in (q, k))
    k_tilde, omega = keys(maps, q_mean, k_mean, eps)
    kc, vc = (by_chunk(x).permute(0, 3, 1, 2, 4) for x in (k, v))  # (B, H, m, c, D)
    beta, _ = values(kc, vc, upcast(omega).to(kc.dtype), scale)
    return k_tilde, beta


class ChunkValues(NamedTuple):
    """ω and what `values` makes of it: β (…, n, D) and the softmax weights (…, n, c)."""

    omega: Tensor
    beta: Tensor
    weights: Tensor

    def chunks(self, c0: int, c1: int) -> ChunkValues:
        """Chunks c0 … c1−1 (views)."""
        return ChunkValues(*(x[..., c0:c1, :] for x in self))


def values_backward(k: Tensor, v: Tensor, state: ChunkValues, d_beta: Tensor, scale: float, into: tuple[Tensor, Tensor]) -> Tensor:
    """d ω (n, D) of one head's `values` (its ω and weights in `state`); adds d k and d v (n, c, D)
    into `into` = (dk, dv) in place.
    With g_j = v_j·dβ: dλ_j = s·w_j·(g_j − Σ_i w_i g_i), dω = Σ_j dλ_j k_j, dk_j = dλ_j (ω − k_j)."""
    dk, dv = into
    omega, weights = state.omega, state.weights
    dv.addcmul_(weights.unsqueeze(-1), d_beta.unsqueeze(-2))
    g = torch.matmul(v, d_beta.unsqueeze(-1)).squeeze(-1)  # (n, c)
    d_lam = weights * (g - (weights * g).sum(-1, keepdim=True)) * scale
    d_omega = torch.matmul(d_lam.unsqueeze(-2), k).squeeze(-2)
    # ω − k_j would be a chunk-sized temporary: add d λ_j·ω, then subtract d λ_j·k_j
    dk.addcmul_(d_lam.unsqueeze(-1), omega.unsqueeze(-2))
    dk.addcmul_(d_lam.unsqueeze(-1), k, value=-1)
    return d_omega


class ChunkRows(NamedTuple):
    """Keys and values (B, N, H, D) in their own layout, read as chunks of c rows, and s."""

    k: Tensor
    v: Tensor
    c: int
    scale: float


def _chunk_rows(x: Tensor, b: int, h: int, n: int, c: int) -> Tensor:
    """The first n chunks of sequence b, head h of x (B, N, H, D) as an (n, c, D) view: a matmul
    operand with no copy (a view across heads and sequences could not be batched without one)."""
    return x[b, : n * c, h].unflatten(0, (n, c))


def sequence_values(rows: ChunkRows, omega: Tensor) -> ChunkValues:
    """`values` of the chunks of k, v (B, N, H, D), one head at a time on views, so no sequence-sized
    product (k·ω, ‖k‖², weights·v) exists at once; ω (B, H, n, D) -> β (B, H, n, D), weights (B, H, n, c)."""
    B, _, H, D = rows.k.shape
    n = omega.shape[-2]
    beta, weights = omega.new_empty(B, H, n, D), omega.new_empty(B, H, n, rows.c)  # in ω's dtype: bf16 k, v upcast per head
    for b in range(B):
        for h in range(H):
            kc, vc = (_chunk_rows(x, b, h, n, rows.c).to(omega.dtype) for x in (rows.k, rows.v))
            beta[b, h], weights[b, h] = values(kc, vc, omega[b, h], rows.scale)
    return ChunkValues(omega, beta, weights)


def sequence_values_backward(rows: ChunkRows, state: ChunkValues, d_beta: Tensor, dk: Tensor, dv: Tensor) -> Tensor:
    """d ω (B, H, n, D) of `sequence_values`; adds its d k and d v into dk, dv (B, N, H, D) in place."""
    B, _, H, D = rows.k.shape
    n, c = state.omega.shape[-2], rows.c
    d_omega = torch.empty_like(state.omega)
    for b in range(B):
        for h in range(H):
            kc, vc = (_chunk_rows(x, b, h, n, c).to(state.omega.dtype) for x in (rows.k, rows.v))
            into = (_chunk_rows(dk, b, h, n, c), _chunk_rows(dv, b, h, n, c))
            head = ChunkValues(state.omega[b, h], state.beta[b, h], state.weights[b, h])
            d_omega[b, h] = values_backward(kc, vc, head, d_beta[b, h], rows.scale, into)
    return d_omega
