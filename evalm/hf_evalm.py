"""EVALM as a `transformers` model: `EvalmConfig` (model_type "evalm") and `EvalmForCausalLM`.

What `evalm export --hf` folders load into (`AutoModelForCausalLM.from_pretrained(folder,
trust_remote_code=True)`: the folder's modeling_evalm.py names these classes; or, with
`evalm.register_with_transformers()`, without remote code). The decoder is `EvalmModel`'s: the same
modules under the same names (embeddings, circular positions, pre-LN `Block`s, final norm, tied LM
head), so an exported model.safetensors loads as it is; only the attention differs in how it is
called: each block's `EvaAttention` projects its heads, hands keys and values to the cache's
`update`, and calls the attention function registered as "eva" (evalm/hf_attention.py), the
`transformers` path. `config.json` holds the `ModelConfig` as its `evalm` section; the usual
`transformers` names (`hidden_size`, `num_hidden_layers`, ...) are derived from it.

Positions count from the cache, as in `EvalmModel`: token i of a context uses row i mod M
(circular) of the learned table; `position_ids`, when given, must be those positions.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from evalm.config_toolkit import ConfigError, build, to_dict, transformers_module
from evalm.config import ModelConfig
from evalm.eva import EvaAttention
from evalm.heads import upcast
from evalm.hf_attention import NAME, register_attention
from evalm.hf_cache import EvaCache
from evalm.model import EvalmModel
from evalm.positions import CircularPositionalEmbedding

tf = transformers_module()
from transformers.modeling_outputs import CausalLMOutputWithPast  # noqa: E402  (after the extra's check)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS  # noqa: E402

DERIVED = {"vocab_size": "vocab_size", "hidden_size": "d_model", "num_hidden_layers": "n_layer",
           "num_attention_heads": "n_head", "intermediate_size": "d_ff"}
"""`transformers` config names read by tools (lm-eval, generate) -> the `ModelConfig` field they mirror."""


class EvalmConfig(tf.PretrainedConfig):
    """A `transformers` config whose `evalm` section is an EVALM `ModelConfig` (validated on load)."""

    model_type = "evalm"

    def __init__(self, evalm: dict | None = None, **kwargs):
        self.evalm = dict(evalm or {})
        model = self.model_config()
        for name in DERIVED:
            kwargs.pop(name, None)
        kwargs["tie_word_embeddings"] = model.tie_embeddings
        self.use_cache = kwargs.pop("use_cache", True)
        super().__init__(**kwargs)
        for name, field in DERIVED.items():
            setattr(self, name, getattr(model, field))

    def model_config(self) -> ModelConfig:
        return build(ModelConfig, self.evalm, where="config.json [evalm]")

    @classmethod
    def of(cls, model: ModelConfig, **kwargs) -> EvalmConfig:
        return cls(evalm=to_dict(model), **kwargs)


class _Call(NamedTuple):
    """What every block's attention needs besides its input (passed where `Block` passes a cache)."""

    cache: EvaCache | None
    mask: Tensor | None


class InterfaceEva(EvaAttention):
    """EVALM's attention with EVA reached through `transformers`' attention interface ("eva")."""

    def forward(self, x: Tensor, call: _Call) -> Tensor:
        B, T, _ = x.shape
        q, k, v = (proj(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        if call.cache is not None:
            k, v = call.cache.update(k, v, self.layer_idx)
        attention = ALL_ATTENTION_FUNCTIONS[NAME]
        out, _ = attention(self, q, k, v, call.mask, scaling=self.head_dim**-0.5,
                           dropout=self.attn_dropout if self.training else 0.0)
        return self.out_proj(out.reshape(B, T, -1))


def _tied_keys():
    """transformers 5 names each tied weight's source; 4.x lists the tied weights."""
    return {"lm_head.weight": "embed_tokens.weight"} if int(tf.__version__.split(".")[0]) >= 5 else ["lm_head.weight"]


class EvalmForCausalLM(tf.PreTrainedModel, tf.GenerationMixin):
    """`EvalmModel`'s decoder under `transformers`: `generate()` keeps an `EvaCache`."""

    config_class = EvalmConfig
    base_model_prefix = ""
    _no_split_modules = ["Block"]
    _tied_weights_keys = _tied_keys()
    _supports_cache_class = True  # transformers 4.x: generate passes a Cache object

    def __init__(self, config: EvalmConfig):
        register_attention()
        super().__init__(config)
        model = config.model_config()
        if model.attention != "eva":
            raise ConfigError(f"config.json [evalm]: attention={model.attention!r}: only EVA models load through "
                              "evalm's transformers classes (evaluate a full-attention model with --checkpoint)")
        for name, module in EvalmModel(model).named_children():  # its modules under its names: its weights load
            self.add_module(name, module)
        for i, block in enumerate(self.blocks):
            block.attn = InterfaceEva(model, i)  # the same parameters, called through the interface
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def _init_weights(self, module: nn.Module) -> None:
        """Fresh weights (a model built from a config, not loaded): OPT's normal init, LayerNorms at 1/0."""
        std = self.config.model_config().init_std
        if isinstance(module, (nn.Linear, nn.Embedding, CircularPositionalEmbedding)):
            nn.init.normal_(module.weight, std=std)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            module.reset_parameters()

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                cache=None, past_key_values=None, labels: Tensor | None = None, use_cache: bool | None = None,
                **kwargs):
        """input_ids (B, T) after what `cache` holds -> logits (B, T, V) (+ the loss of `labels`,
        shifted as in every `transformers` causal LM), and the `EvaCache` with use_cache."""
        cache = EvaCache.continuing(cache if cache is not None else past_key_values,
                           self.config.use_cache if use_cache is None else use_cache, self.config)
        B, T = input_ids.shape
        start = cache.state.get_pos() if cache is not None else 0
        if position_ids is not None:
            _check_positions(position_ids, start, T)
        x = self.drop(self.embed_tokens(input_ids) + self.embed_positions(start, T))
        call = _Call(cache, attention_mask)
        for block in self.blocks:
            x = block(x, call)
        logits = self.lm_head(self.final_norm(x))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(upcast(logits[:, :-1]).flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        return _output(loss, logits, cache)


def _check_positions(position_ids: Tensor, start: int, T: int) -> None:
    want = torch.arange(start, start + T, device=position_ids.device)
    if not bool((position_ids == want).all()):
        raise ConfigError(f"position_ids {position_ids[0, :4].tolist()}... are not the cache's positions {start}.."
                          f"{start + T - 1}: EVALM's positions count from the start of its cache (docs/model.md)")


def _output(loss, logits: Tensor, cache) -> CausalLMOutputWithPast:
    """The output, its cache under this transformers' name for it (`cache`, formerly `past_key_values`)."""
    names = {f.name for f in dataclasses.fields(CausalLMOutputWithPast)}
    return CausalLMOutputWithPast(loss=loss, logits=logits, **{"cache" if "cache" in names else "past_key_values": cache})
