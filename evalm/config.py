"""The shape of one EVALM decoder: `ModelConfig`, a frozen dataclass read from a `[model]` section.

`ModelConfig` lives here because every package above `evalm/` needs it. Reading TOML, validating
a section (`build`, which names unknown keys with the valid ones), overrides and `ConfigError` are
the ground floor's `config_toolkit`.
"""

from __future__ import annotations

import dataclasses

from typing import Literal

from pydantic.dataclasses import dataclass

from evalm.config_toolkit import ConfigError, FROZEN
from evalm.attention import ATTENTION  # the one dict of attention classes
from evalm.eva_settings import EvaSettings


@dataclass(config=FROZEN, frozen=True)
class ModelConfig(EvaSettings):
    """Shape of one EVALM decoder (docs/model.md): EVA's settings (`EvaSettings`, inherited, so the
    `[model]` section, checkpoints and exports keep their flat keys) plus the decoder's own fields."""

    vocab_size: int = 50272
    """Rows of the token embedding (padded vocabulary; OPT pads GPT-2's to 50272)."""
    d_model: int = 1024
    """Residual width E."""
    n_layer: int = 24
    """Number of decoder blocks."""
    n_head: int = 16
    """Attention heads H; the head dimension is d_model // n_head."""
    d_ff: int = 4096
    """Hidden width of the feed-forward layer (4E in OPT)."""
    circular_period: int = 8192
    """M: rows of the learned position table; token i uses row i mod M (EVALM §3.1)."""
    positions: Literal["circular", "absolute"] = "circular"
    """'circular': token i uses row i mod M (EVALM §3.1); 'absolute': the vanilla learned table it is
    compared with, row min(i, M - 1) past its end (the extrapolation baseline, evalm/positions.py)."""
    attention: str = "eva"
    """'eva' or 'full' (exact causal softmax attention, the baseline)."""
    activation: Literal["relu", "gelu"] = "relu"
    """Feed-forward nonlinearity (OPT uses ReLU)."""
    dropout: float = 0.1
    """Residual dropout (EVALM Table 6)."""
    attn_dropout: float = 0.1
    """Dropout on the joint attention probabilities."""
    tie_embeddings: bool = True
    """Share the input embedding with the output projection (OPT)."""
    init_std: float = 0.006
    """Standard deviation of the normal inits (OPT's megatron sigma)."""

    def __post_init__(self) -> None:
        super().__post_init__()  # EVA's own checks (window, chunk, sink)
        for name in ("vocab_size", "d_model", "n_layer", "n_head", "d_ff", "circular_period"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.attention not in ATTENTION:
            raise ConfigError(f"attention={self.attention!r} is not known; valid: {sorted(ATTENTION)}")
        if self.d_model % self.n_head:
            raise ConfigError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")
        if self.sink_tokens and self.attention != "eva":
            raise ConfigError(f"sink_tokens={self.sink_tokens} is EVA's: attention={self.attention!r} has no summaries "
                              "to replace; set sink_tokens=0 or attention='eva'")
        if self.select_by == "window-bound":
            raise ConfigError("select_by='window-bound' ranks keys moved by a rotary host (an EVA Llama with "
                              "selected_positions='window'); this model's positions are its own: use 'bound' or 'summary'")
        if not (0.0 <= self.dropout < 1.0 and 0.0 <= self.attn_dropout < 1.0):
            raise ConfigError("dropout and attn_dropout must lie in [0, 1)")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head


NON_ARCHITECTURE = frozenset({"dropout", "attn_dropout", "init_std"})
"""ModelConfig fields that change no parameter and no computation at evaluation: a resume or a load
may differ in them."""


def architecture_differences(saved: dict, current: dict) -> list[tuple[str, object, object]]:
    """(field, saved value, current value) for each architecture field that differs. A field missing
    from `saved` (written before the field existed) counts as its default."""
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    return [(k, saved.get(k, defaults.get(k)), v) for k, v in current.items()
            if k not in NON_ARCHITECTURE and saved.get(k, defaults.get(k)) != v]
