"""A Llama-family decoder (SmolLM2's architecture) with EVA attention: `EvaLlamaConfig`, `EvaLlamaForCausalLM`.

`transformers`' own Llama (RMSNorm, SwiGLU, RoPE, grouped-query attention) with two additions:
every attention module carries EVA's parameters as `self_attn.eva` (A_q, A_k, the T5 bias:
evalm/hf_attention.py, `eva_parts`), and the attention implementation is "eva" (what loading asks
for is overridden: the same weights with softmax attention are a plain `LlamaForCausalLM`). The EVA
settings are the config's `evalm` section:

| key | meaning | default |
|---|---|---|
| `window_size`, `chunk_size`, `overlap_window`, `use_t5_bias`, `exclude_window_chunks`, `adaptive_proj`, `sink_tokens` | EVA's, as in `ModelConfig` (docs/model.md) | `ModelConfig`'s |
| `positions` | `"rope"`: RoPE at each token's position; `"circular"`: at position i mod `circular_period` (EVALM §3.1's circular positions, applied to RoPE) | `"rope"` |
| `circular_period` | M, with `positions = "circular"` | 8192 |
| `sink_positions` | with `sink_tokens`: `"own"`, sink keys at their own positions; `"window"`, moved to sit right before the query's window (StreamingLLM's positions inside its cache), so their distance from a query stays inside the trained range at any length | `"own"` |

`EvaLlamaForCausalLM.from_llama(model, **settings)` turns a loaded `LlamaForCausalLM` into one (its
weights kept, A_q/A_k initialised as the EVA reference does). Its forward replaces the empty cache
`generate()` makes with an `EvaCache`, so `generate()` runs in memory linear in the length.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from evalm.config_toolkit import ConfigError
from evalm.hf_attention import EVA_FIELDS, NAME, check_heads, eva_parts, register_attention, transformers_module
from evalm.hf_cache import CACHE_ARG, EvaCache
from evalm.hf_private import set_attention

tf = transformers_module()

POSITION_FIELDS = ("positions", "circular_period", "sink_positions")
STATIC_ROPE = ("default", "linear", "llama3")
"""RoPE types whose rotation is a fixed angle per position, so RoPE at p then at s is RoPE at p + s."""
WHERE = "config.json [evalm]"


class EvaLlamaConfig(tf.LlamaConfig):
    """`LlamaConfig` plus the `evalm` section (attention "eva")."""

    model_type = "eva_llama"

    def __init__(self, evalm: dict | None = None, **kwargs):
        self.evalm = dict(evalm or {})
        _check_shape(kwargs)
        unknown = sorted(set(self.evalm) - set(EVA_FIELDS) - set(POSITION_FIELDS))
        if unknown:
            raise ConfigError(f"{WHERE}: unknown key(s) {unknown}; valid keys: {[*EVA_FIELDS, *POSITION_FIELDS]}")
        if self.evalm.get("positions", "rope") not in ("rope", "circular"):
            raise ConfigError(f"{WHERE}: positions={self.evalm['positions']!r}; valid: 'rope', 'circular'")
        if self.evalm.get("sink_positions", "own") not in ("own", "window"):
            raise ConfigError(f"{WHERE}: sink_positions={self.evalm['sink_positions']!r}; valid: 'own', 'window'")
        period = self.evalm.get("circular_period", 8192)
        if isinstance(period, bool) or not isinstance(period, int) or period < 1:
            raise ConfigError(f"{WHERE}: circular_period={period!r} must be an integer >= 1")
        kwargs.setdefault("attn_implementation", NAME)
        super().__init__(**kwargs)

    def circular_period(self) -> int | None:
        """M when positions are circular, else None."""
        return self.evalm.get("circular_period", 8192) if self.evalm.get("positions", "rope") == "circular" else None


def _check_shape(values: dict) -> None:
    """The head layout of a config, refused in one line naming the field before `transformers`
    validates it (its own message spans lines)."""
    H = values.get("num_attention_heads")
    if H is None:
        return
    if not values.get("head_dim") and values.get("hidden_size", H) % H:
        raise ConfigError(f"config.json: hidden_size={values['hidden_size']} is not a multiple of num_attention_heads="
                          f"{H} and no head_dim is given: EVA needs whole heads")
    D = values.get("head_dim") or values.get("hidden_size", H) // H
    H_kv = values.get("num_key_value_heads") or H
    check_heads(H, H_kv, D, D, where="config.json")


class EvaLlamaForCausalLM(tf.LlamaForCausalLM):
    """`LlamaForCausalLM` whose attention is EVA (`attn_implementation="eva"`)."""

    config_class = EvaLlamaConfig

    def __init__(self, config: EvaLlamaConfig):
        register_attention()
        super().__init__(config)
        set_attention(config, NAME)  # EVA whatever was asked: a plain Llama of these weights is LlamaForCausalLM
        H = config.num_attention_heads
        D = getattr(config, "head_dim", None) or config.hidden_size // H
        settings = {k: v for k, v in config.evalm.items() if k in EVA_FIELDS}
        if config.circular_period() is not None:
            self.model.rotary_emb = CircularRotary(self.model.rotary_emb, config.circular_period())
        move = self._sink_move(config)
        for layer in self.model.layers:
            attn = layer.self_attn
            attn.eva = eva_parts(settings, H, D, float(config.attention_dropout or 0.0), attn.layer_idx, WHERE)
            attn.eva.sink_shift = move

    def _sink_move(self, config: EvaLlamaConfig) -> RotaryMove | None:
        """The move of sink keys `sink_positions = "window"` asks for, refused in one line where RoPE
        cannot compose it."""
        if config.evalm.get("sink_positions", "own") == "own":
            return None
        if not config.evalm.get("sink_tokens"):
            raise ConfigError(f"{WHERE}: sink_positions='window' without sink_tokens: there is no sink to place")
        if config.circular_period() is not None:
            raise ConfigError(f"{WHERE}: sink_positions='window' with positions='circular': a circular rotation wraps "
                              "and does not compose; use positions='rope'")
        rope = getattr(self.model.rotary_emb, "rope_type", "default")
        if rope not in STATIC_ROPE or getattr(self.model.rotary_emb, "attention_scaling", 1.0) != 1.0:
            raise ConfigError(f"{WHERE}: sink_positions='window' needs a RoPE that is a fixed rotation per position "
                              f"({', '.join(STATIC_ROPE)}), not rope_type {rope!r}")
        return RotaryMove(self.model.rotary_emb)

    @classmethod
    def from_llama(cls, llama, **settings) -> EvaLlamaForCausalLM:
        """A loaded `LlamaForCausalLM` with EVA: its weights, A_q/A_k (and the T5 table) freshly
        initialised as the EVA reference does, `settings` the `evalm` section."""
        values = {k: v for k, v in llama.config.to_dict().items() if k not in ("model_type", "architectures")}
        values.pop("attn_implementation", None)
        config = EvaLlamaConfig(evalm=settings, **values)
        model = cls(config).to(device=next(llama.parameters()).device, dtype=next(llama.parameters()).dtype)
        missing, unexpected = model.load_state_dict(llama.state_dict(), strict=False)
        if unexpected or any(".eva." not in name for name in missing):
            raise ValueError(f"not a Llama of this shape: missing {missing[:3]}, unexpected {unexpected[:3]}")
        for layer in model.model.layers:
            init_eva_parts(layer.self_attn.eva)
        return model.eval() if not llama.training else model

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None, cache=None, past_key_values=None, use_cache: bool | None = None,
                **kwargs):
        """Llama's forward with an `EvaCache` in place of an empty cache of another kind."""
        use_cache = self.config.use_cache if use_cache is None else use_cache
        cache = cache if cache is not None else past_key_values
        kwargs[CACHE_ARG] = EvaCache.continuing(cache, use_cache, self.config)
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               use_cache=use_cache, **kwargs)


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


@torch.no_grad()
def init_eva_parts(eva: nn.Module) -> None:
    """The EVA reference's inits of A_q/A_k (Xavier-uniform, gain 1/√2; LayerNorm 1/0) and the T5 table (N(0, 1))."""
    for seq in (eva.adaptive_mu_q, eva.adaptive_mu_k):
        seq[0].reset_parameters()
        nn.init.xavier_uniform_(seq[0].weight, gain=2**-0.5)
        for mod in seq[1:]:
            mod.reset_parameters()
    if eva.rel_pos_bias is not None:
        nn.init.normal_(eva.rel_pos_bias.relative_attention_bias.weight)
