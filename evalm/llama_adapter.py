"""The one adapter between a Hugging Face Llama and EVA, as torchtitan's state-dict adapters are: the
config (what of a Llama's config an EVA Llama carries, and its `evalm` section), the weights (a Llama's
state dict into the EVA model, EVA's own parts initialised), the positions (circular RoPE, sink keys
moved by a rotation) and the sink rule. `EvaLlamaForCausalLM` (evalm/hf_llama.py) and `evalm convert`
(train/convert.py) both go through it; the settings are evalm/eva_settings.py's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from evalm.config_toolkit import ConfigError
from evalm.eva_settings import MAP_INITS, EvaSettings, RotaryPlacement, check_sink_rule

NOT_CARRIED = ("model_type", "architectures", "attn_implementation", "quantization_config")
"""A Llama config's keys an EVA Llama does not take over (its own type and architecture, the attention it
asked for, a dequantised GGUF's note on a quantisation that is not this model's)."""
STATIC_ROPE = ("default", "linear", "llama3")
"""RoPE types whose rotation is a fixed angle per position, so RoPE at p then at s is RoPE at p + s."""


def carried(llama_config) -> dict[str, Any]:
    """The values of a Llama's `transformers` config an EVA Llama's config takes over."""
    return {k: v for k, v in llama_config.to_dict().items() if k not in NOT_CARRIED}


def load_llama_weights(model: nn.Module, llama: nn.Module) -> None:
    """A Llama's weights into an EVA Llama of its shape: every tensor but EVA's own parts (`.eva.`) must match."""
    missing, unexpected = model.load_state_dict(llama.state_dict(), strict=False)
    if unexpected or any(".eva." not in name for name in missing):
        raise ValueError(f"not a Llama of this shape: missing {missing[:3]}, unexpected {unexpected[:3]}")


@torch.no_grad()
def init_parts(eva: nn.Module, init: str = "reference") -> None:
    """EVA's own parts of one layer at zero steps. `reference`: A_q/A_k as the EVA reference draws them
    (Xavier-uniform, gain 1/√2; LayerNorm 1/0) and the T5 table N(0, 1). `identity`: k̃ = A_k(k̄) = k̄ and
    ω = A_q(q̄) + k̃ = q̄ + k̄ (both maps the identity); `mean-key`: A_q zero (ω = k̄); with either the T5 table
    is zero."""
    if init not in MAP_INITS:  # the names and what each does: eva_settings.MapInit
        raise ConfigError(f"init={init!r}; valid: {', '.join(map(repr, MAP_INITS))}")
    if init == "reference":
        for seq in (eva.adaptive_mu_q, eva.adaptive_mu_k):
            seq[0].reset_parameters()
            nn.init.xavier_uniform_(seq[0].weight, gain=2**-0.5)
            for mod in seq[1:]:
                mod.reset_parameters()
        if eva.rel_pos_bias is not None:
            nn.init.normal_(eva.rel_pos_bias.relative_attention_bias.weight)
        return
    for linear, eye in ((eva.adaptive_mu_k[0], True), (eva.adaptive_mu_q[0], init == "identity")):
        linear.weight.copy_(torch.eye(linear.weight.shape[0], dtype=linear.weight.dtype) if eye else 0.0)
        if linear.bias is not None:
            linear.bias.zero_()
    if eva.rel_pos_bias is not None:
        eva.rel_pos_bias.relative_attention_bias.weight.zero_()


class CircularRotary(nn.Module):
    """RoPE at position i mod M: EVALM's circular positions (§3.1) for a rotary model. The model's
    position_ids stay absolute (masks and caches count them); only the rotation wraps."""

    def __init__(self, rotary: nn.Module, period: int):
        super().__init__()
        self.rotary, self.period = rotary, period

    def forward(self, x: Tensor, position_ids: Tensor):
        return self.rotary(x, position_ids % self.period)


class RotaryMove:
    """Moves RoPE-rotated keys by a position shift: RoPE rotates each pair of a head's dimensions by an
    angle linear in the position, so rotating a key already at position p by RoPE at s puts it at p + s.
    EVA's sink keys (rotated at their positions 0 … S − 1) are moved so that a block's sink sits right
    before its window (`EvaAttention.sink_shift`, evalm/tiles.py)."""

    def __init__(self, rotary: nn.Module):
        self.rotary = rotary

    def __call__(self, keys: Tensor, shift: Tensor) -> Tensor:
        """keys (…, D) moved by `shift` (integers, broadcast over keys' leading dimensions)."""
        cos, sin = self.rotary(keys, shift.reshape(1, -1))  # (1, N, D), one angle set per shift
        cos, sin = (x.view(*shift.shape, -1) for x in (cos, sin))
        half = keys.shape[-1] // 2
        rotated_half = torch.cat([-keys[..., half:], keys[..., :half]], -1)  # Llama's rotate_half
        return keys * cos + rotated_half * sin


def check_settings(eva: EvaSettings, placement: RotaryPlacement, where: str) -> None:
    """The settings' own rule for a Llama (`check_sink_rule`), refused in one line naming `where`."""
    try:
        check_sink_rule(eva, placement)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


def sink_move(placement: RotaryPlacement, rotary: nn.Module, where: str) -> RotaryMove | None:
    """The move of keys that `sink_positions` or `selected_positions` = "window" asks for (None: keys at their
    own positions), for settings that met the sink rule when their config was made (`check_settings`); refused
    in one line where the model's RoPE cannot compose with it: it must be a fixed rotation per position."""
    moved = [name for name in ("sink_positions", "selected_positions") if getattr(placement, name) != "own"]
    if not moved:
        return None
    rope = getattr(rotary, "rope_type", "default")
    if rope not in STATIC_ROPE or getattr(rotary, "attention_scaling", 1.0) != 1.0:
        raise ConfigError(f"{where}: {moved[0]}='window' needs a RoPE that is a fixed rotation per position "
                          f"({', '.join(STATIC_ROPE)}), not rope_type {rope!r}")
    return RotaryMove(rotary)


def rotary_for(rotary: nn.Module, placement: RotaryPlacement) -> nn.Module:
    """The model's rotary embedding as the placement asks: circular RoPE wraps it, plain RoPE is itself."""
    period = placement.period()
    return CircularRotary(rotary, period) if period is not None else rotary
