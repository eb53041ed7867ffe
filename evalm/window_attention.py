"""Window-only attention: EVA's block-local causal softmax with no remote chunk summaries.

The control of the trained recall study (configs/study-recall.toml): the same visibility rule as EVA's
local part (`Tiling.window_start`, docs/eva.md), so the only difference from `eva` is the remote
branch. For the query at absolute position i, with w = window_size and ext = w when
overlap_window (else 0):

  local keys  L(i) = { j : max(0, ⌊i/w⌋·w − ext) ≤ j ≤ i }     (a causal block, not a sliding window)
  o_i = softmax([s·q_i·k_j]_{j∈L(i)}) · [v_j]

so nothing before the previous block boundary (minus ext) is ever read: recall past the block is
impossible by construction, and what EVA retrieves beyond it comes from its summaries.

Computed per block (a tile of w queries against its ext + w keys, O(T·w) memory). With a cache
the state is the K/V rows from the first row the next token can see, `WindowState`; a merged prefix
(`evalm.cache.merge`) is attended to in the same softmax, the own logits raised by
`cache.own_logit_bias`. No T5 bias: `use_t5_bias` is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from evalm.cache import Cache
from evalm.config_toolkit import ConfigError
from evalm.heads import HeadProjections, HeadShape, upcast


@dataclass(frozen=True)
class WindowState:
    """One window-only layer: K/V (B, H, R, D) of the rows from `first_row` to the last token seen."""

    k: Tensor
    v: Tensor

    def entries(self) -> tuple[Tensor, Tensor]:
        return self.k, self.v

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v))

    def disowned(self) -> WindowState:
        return self  # no parts: every update builds new tensors


def first_row(n: int, window: int, ext: int) -> int:
    """The first key row the token at absolute position n can see (its block's start minus ext)."""
    return max(0, n // window * window - ext)


class WindowAttention(HeadProjections):
    """Block-local causal softmax attention (EVA without its remote branch)."""

    def __init__(self, config, layer_idx: int = 0):
        super().__init__(HeadShape.of(config), layer_idx)
        if config.use_t5_bias:
            raise ConfigError("attention='window' has no T5 bias; set use_t5_bias = false")
        self.window = config.window_size
        self.ext = config.window_size if config.overlap_window else 0

    def init_weights(self) -> None:
        self.init_projections()

    def forward(self, x: Tensor, cache: Cache | None = None) -> Tensor:
        q, k, v = self.qkv(x)
        n_seen = cache.n_seen if cache is not None else 0
        state = cache.layers[self.layer_idx] if cache is not None else None
        if state is not None:  # a batch of forks reads its batch-1 parent's rows broadcast
            B = q.shape[0]
            k = torch.cat([state.k.expand(B, -1, -1, -1), k], -2)
            v = torch.cat([state.v.expand(B, -1, -1, -1), v], -2)
        prefix = cache.prefix[self.layer_idx] if cache is not None else None
        bias = cache.own_logit_bias if cache is not None else 0.0
        out = self._attend(q, k, v, n_seen, prefix, bias)
        if cache is not None:
            keep = first_row(n_seen + q.shape[-2], self.window, self.ext) - first_row(n_seen, self.window, self.ext)
            cache.layers[self.layer_idx] = WindowState(k[..., keep:, :], v[..., keep:, :])
        return self.merge(out)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, n_seen: int, prefix, bias: float) -> Tensor:
        """q (B, H, T, D) at positions n_seen.., k/v (B, H, K, D) from first_row(n_seen) -> (B, H, T, D).

        The queries are padded to whole blocks from a = ⌊n_seen/w⌋·w and the keys so that row r is
        position a − ext + r; block b then reads key rows [b·w, b·w + ext + w) (an `unfold`)."""
        B, H, T, D = q.shape
        w, ext = self.window, self.ext
        a = n_seen // w * w
        nb = -(-(n_seen + T - a) // w)
        front = (a - ext) - first_row(n_seen, w, ext)  # <= 0: rows of negative position to pad
        qp = F.pad(q, (0, 0, n_seen - a, nb * w - (n_seen - a) - T))
        kp = F.pad(k, (0, 0, -front, ext + nb * w + front - k.shape[-2]))
        vp = F.pad(v, (0, 0, -front, ext + nb * w + front - v.shape[-2]))
        kt = kp.unfold(-2, ext + w, w).transpose(-1, -2)  # (B, H, nb, ext + w, D)
        vt = vp.unfold(-2, ext + w, w).transpose(-1, -2)
        logits = upcast(D**-0.5 * (qp.view(B, H, nb, w, D) @ kt.transpose(-1, -2)))  # (B, H, nb, w, ext + w)
        row = torch.arange(w, device=q.device).view(w, 1)
        col = torch.arange(ext + w, device=q.device).view(1, ext + w)
        key_pos = a - ext + w * torch.arange(nb, device=q.device).view(nb, 1, 1) + col  # (nb, 1, ext + w)
        visible = (col - ext <= row) & (key_pos >= 0)  # causal within the tile, no padded front rows
        logits = logits.masked_fill(~visible, float("-inf")) + bias
        values = [vt]
        if prefix is not None:  # merged entries: no bias, always visible
            pk, pv = prefix
            shared = upcast(D**-0.5 * (qp @ pk.transpose(-1, -2))).view(B, H, nb, w, -1)
            logits = torch.cat([shared, logits], -1)
            values = [pv.unsqueeze(2).expand(-1, -1, nb, -1, -1), vt]
        probs = torch.softmax(logits, -1).to(q.dtype)
        probs = F.dropout(probs, self.attn_dropout, self.training)
        out = probs @ torch.cat(values, -2)  # (B, H, nb, w, D)
        return out.reshape(B, H, nb * w, D)[..., n_seen - a : n_seen - a + T, :]
