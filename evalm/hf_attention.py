"""EVA as a `transformers` attention implementation: `eva_attention`, registered under "eva".

A Hugging Face attention module (Llama's, or EVALM's own in evalm/hf_evalm.py) projects its heads,
rotates them (RoPE), hands the keys and values to the cache's `update`, then calls the function
registered under its config's attention name as `f(module, query, key, value, attention_mask,
scaling, dropout)`, heads (B, H, T, D). Registered as "eva" (`register_attention`), that function
runs `EvaAttention.attend` on those heads: the module carries EVA's own parameters (A_q, A_k, the
T5 bias) as `module.eva`, an `EvaAttention` of its heads without projections, or is itself an
`EvaAttention` (EVALM). Grouped-query keys and values are repeated to the query heads, as every
`transformers` attention does: a group's remote keys k̃ = A_k(k̄) are then equal and its remote
values β differ by query head (ω = A_q(q̄) + k̃ involves the head's queries).

The cache: `transformers` calls `cache.update(key, value, layer_idx)` right before the attention,
so an `EvaCache` (evalm/hf_cache.py) returns the new heads tagged with its layer (`CARRIER`), and
the attention continues that layer's evalm state (window K/V, pending queries, chunk summaries).
Without a cache (training, one-shot scoring) the whole-sequence path runs. A cache of another kind
that already holds tokens is refused: it kept their keys but not their queries, which EVA's chunk
summaries need.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from evalm.config_toolkit import ConfigError, transformers_module
from evalm.eva import EvaAttention

NAME = "eva"
"""The attention implementation's name: `attn_implementation="eva"`."""

CARRIER = "_evalm_eva_layer"
"""Attribute of the key tensor an `EvaCache.update` returns: the cache layer the attention continues."""


def check_heads(n_head: int, n_kv_head: int, head_dim: int, v_head_dim: int, where: str) -> None:
    """Refuse, naming the field, a head layout EVA cannot take."""
    if n_head < 1 or head_dim < 1:
        raise ConfigError(f"{where}: num_attention_heads={n_head} and head_dim={head_dim} must be >= 1")
    if n_kv_head < 1 or n_head % n_kv_head:
        raise ConfigError(f"{where}: num_key_value_heads={n_kv_head} does not divide num_attention_heads={n_head}: "
                          "EVA repeats each key/value head over a whole group of query heads")
    if v_head_dim != head_dim:
        raise ConfigError(f"{where}: the value head size {v_head_dim} differs from head_dim={head_dim}: EVA's window "
                          "rows and chunk summaries need one head size for keys and values")


def eva_of(module) -> EvaAttention:
    """The EVA parameters of a `transformers` attention module."""
    if isinstance(module, EvaAttention):
        return module
    eva = getattr(module, "eva", None)
    if not isinstance(eva, EvaAttention):
        raise ConfigError(f"{type(module).__name__} (layer {getattr(module, 'layer_idx', '?')}) has no EVA parameters: "
                          "load an EVA model (`evalm.register_with_transformers()`, docs/model.md, 'EVA in "
                          "transformers'), not a plain one with attn_implementation='eva'")
    return eva


def eva_attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                  scaling: float | None = None, dropout: float = 0.0, **kwargs) -> tuple[Tensor, None]:
    """The "eva" attention function: heads (B, H, T, D) after the cache's update -> (B, T, H, D).

    `dropout` is the module's own rate; EVA applies its `attn_dropout` (set from the same config
    field when the parts were built) with its own hashed mask (evalm/dropout_mask.py)."""
    eva = eva_of(module)
    B, H, T, D = query.shape
    if scaling is not None and not math.isclose(scaling, D**-0.5, rel_tol=1e-9):
        raise ConfigError(f"{type(module).__name__}: attention scaling {scaling} is not head_dim^-1/2 = {D**-0.5}: "
                          "EVA scales every logit, local and remote, by D^-1/2 (docs/eva.md)")
    refuse_left_padding(attention_mask)
    layer = getattr(key, CARRIER, None)
    if layer is None and key.shape[-2] != T:
        raise ConfigError(f"EVA got {key.shape[-2]} cached keys for {T} queries from a cache that is not EVA's: pass "
                          "an `evalm.hf_cache.EvaCache`, or load the model with evalm's classes, which make one")
    groups = H // key.shape[1]
    # private copies in EVA's (B, T, H, D) layout: the whole-sequence backward writes over its inputs
    q = query.transpose(1, 2).clone(memory_format=torch.contiguous_format)
    k, v = (x.repeat_interleave(groups, 1).transpose(1, 2).clone(memory_format=torch.contiguous_format)
            for x in (key, value))
    if layer is None:
        return eva.attend(q, k, v), None
    out = eva.attend(q, k, v, layer.state_cache())
    layer.attended(T)
    return out, None


def refuse_left_padding(mask: Tensor | None) -> None:
    """Only right padding may reach EVA: a padded key before a real one would shift the blocks,
    chunks and positions of every later token (docs/model.md, "The cache"). `mask`: None, the 2-D
    padding mask (B, K), or a 4-D mask (B, 1, T, K), boolean (True: attend) or additive (0: attend)."""
    if mask is None:
        return
    if mask.dim() == 4:  # the last query sees every real key: its row is the padding mask
        row = mask[:, 0, -1, :]
        keep = row if row.dtype == torch.bool else row == 0
    else:
        keep = mask.bool()
    if bool((keep[:, 1:] & ~keep[:, :-1]).any()):
        raise ConfigError("EVA takes right-padded batches only (or no padding): a padded token before a real one "
                          "shifts EVA's blocks and chunks; pad on the right (tokenizer.padding_side = 'right') or "
                          "use batch size 1")


def register_attention(name: str = NAME, function=eva_attention) -> None:
    """Register `function` (default `eva_attention`, under "eva") and, where `transformers` has one, the mask
    function its inputs need. Idempotent; called by `evalm.register_with_transformers()` and by evalm's model
    classes, and with the functions that wrap EVA's (attention transfer's, the probe's) under their own names."""
    tf = transformers_module()
    tf.AttentionInterface.register(name, function)
    try:
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:  # older transformers build the mask in the model: it reaches EVA as a 4-D mask
        return
    AttentionMaskInterface.register(name, sdpa_mask)  # a boolean mask, None when nothing is padded
