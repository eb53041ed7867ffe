"""A Llama-family decoder (SmolLM2's architecture) with EVA attention: `EvaLlamaConfig`, `EvaLlamaForCausalLM`.

`transformers`' own Llama (RMSNorm, SwiGLU, RoPE, grouped-query attention) with two additions:
every attention module carries EVA's parameters as `self_attn.eva` (A_q, A_k, the T5 bias: an
`EvaAttention` of its heads without projections, evalm/eva.py), and the attention implementation is "eva" (what loading asks
for is overridden: the same weights with softmax attention are a plain `LlamaForCausalLM`). The EVA
settings are the config's `evalm` section:

| keys | what | schema |
|---|---|---|
| `window_size`, `chunk_size`, `overlap_window`, `use_t5_bias`, `exclude_window_chunks`, `sink_tokens`, `adaptive_proj`, `select_chunks`, `select_only`, `select_by` | EVA's rule and maps, as in `ModelConfig` (docs/model.md) | `EvaSettings` |
| `positions`, `circular_period`, `sink_positions`, `selected_positions` | where RoPE puts EVA's keys: at each position or i mod M; sink keys and selected tokens at their own positions or moved before the window | `RotaryPlacement` |

Both classes and their defaults are evalm/eva_settings.py's, validated once when the config is made from
a section (an unknown key, a bad value or a sink move that cannot compose is one line naming
`config.json [evalm]`); a config made from settings already checked (a conversion's, as the pair
(`EvaSettings`, `RotaryPlacement`)) writes them as its section and checks them no second time. The
weights, positions and sink rule go through evalm/llama_adapter.py.

`EvaLlamaForCausalLM.from_llama(model, init, settings=... or **section)` turns a loaded `LlamaForCausalLM`
into one (its weights kept, A_q/A_k initialised by `init`: the EVA reference's draw unless asked otherwise). Its forward replaces the empty cache
`generate()` makes with an `EvaCache`, so `generate()` runs in memory linear in the length.
"""

from __future__ import annotations

from torch import Tensor

from evalm import llama_adapter
from evalm.config_toolkit import ConfigError, build, transformers_module
from evalm.eva import EvaAttention
from evalm.eva_settings import EVA_FIELDS, PLACEMENT_FIELDS, EvaSettings, RotaryPlacement, evalm_section
from evalm.heads import HeadShape
from evalm.hf_attention import NAME, check_heads, register_attention
from evalm.hf_cache import CACHE_ARG, EvaCache
from evalm.hf_private import set_attention

tf = transformers_module()

WHERE = "config.json [evalm]"


class EvaLlamaConfig(tf.LlamaConfig):
    """`LlamaConfig` plus the `evalm` section (attention "eva"): an `EvaSettings` and a `RotaryPlacement`."""

    model_type = "eva_llama"

    def __init__(self, evalm: dict | tuple[EvaSettings, RotaryPlacement] | None = None, **kwargs):
        """`evalm`: the section as config.json holds it, checked here (every value, and the sink rule), or the
        settings a conversion checked when it read them, written as that section."""
        _check_shape(kwargs)
        if isinstance(evalm, tuple):
            self.evalm = evalm_section(*evalm)
        else:
            self.evalm = dict(evalm or {})
            unknown = sorted(set(self.evalm) - set(EVA_FIELDS) - set(PLACEMENT_FIELDS))
            if unknown:
                raise ConfigError(f"{WHERE}: unknown key(s) {unknown}; valid keys: {[*EVA_FIELDS, *PLACEMENT_FIELDS]}")
            llama_adapter.check_settings(self.eva_settings(), self._placement(), WHERE)
        kwargs.setdefault("attn_implementation", NAME)
        super().__init__(**kwargs)

    def eva_settings(self) -> EvaSettings:
        """EVA's rule and maps (a key the section omits takes `EvaSettings`' default)."""
        return build(EvaSettings, {k: v for k, v in self.evalm.items() if k in EVA_FIELDS}, where=WHERE)

    def _placement(self) -> RotaryPlacement:
        return build(RotaryPlacement, {k: v for k, v in self.evalm.items() if k in PLACEMENT_FIELDS}, where=WHERE)

    def placement(self) -> RotaryPlacement:
        """Where RoPE puts EVA's keys, its period spelled out (`RotaryPlacement.resolved`)."""
        return self._placement().resolved(self.eva_settings().window_size, self.max_position_embeddings)


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
        heads = HeadShape(H, getattr(config, "head_dim", None) or config.hidden_size // H,
                          float(config.attention_dropout or 0.0), H // (config.num_key_value_heads or H))
        settings, placement = config.eva_settings(), config.placement()
        move = llama_adapter.sink_move(placement, self.model.rotary_emb, WHERE)
        self.model.rotary_emb = llama_adapter.rotary_for(self.model.rotary_emb, placement)
        for layer in self.model.layers:
            attn = layer.self_attn
            attn.eva = EvaAttention(settings, attn.layer_idx, heads)  # EVA's own parts; the projections are Llama's
            attn.eva.sink_shift = move if placement.sink_positions == "window" else None
            attn.eva.select_shift = move if placement.selected_positions == "window" else None

    @classmethod
    def from_llama(cls, llama, init: str = "reference", settings: tuple[EvaSettings, RotaryPlacement] | None = None,
                   **section) -> EvaLlamaForCausalLM:
        """A loaded `LlamaForCausalLM` with EVA: its weights, EVA's parts initialised by `init`
        (llama_adapter.init_parts), `settings` as a conversion checked them, else `section` the `evalm` section."""
        config = EvaLlamaConfig(evalm=section if settings is None else settings, **llama_adapter.carried(llama.config))
        model = cls(config).to(device=next(llama.parameters()).device, dtype=next(llama.parameters()).dtype)
        llama_adapter.load_llama_weights(model, llama)
        for layer in model.model.layers:
            llama_adapter.init_parts(layer.self_attn.eva, init)
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
