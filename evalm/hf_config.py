"""The sizes of a Hugging Face config.json, bounded before anything reads them.

`transformers` builds whatever config.json describes: a `hidden_size` of -32, 0, 32.5 or "32", an
`intermediate_size` of 2^40 or a `rope_scaling` of a type it does not know ended deep in building a
model, as an error of the library reported as a bug (or a model of terabytes being allocated). Each
size key a model family uses is here with its range; a value present under one of them must be a
whole number (a JSON integer, not a boolean) inside it, and a RoPE scaling a table of a type
`transformers` knows. A refusal is one line naming the file and the key. The ranges are far above
any published model's (Llama 3.1 405B: 126 layers, width 16384, feed-forward 53248, 128k tokens).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evalm.config_toolkit import InputError

MAX_LAYERS = 1024
MAX_WIDTH = 1 << 18
MAX_HEADS = 1 << 12
MAX_VOCAB = 1 << 22
MAX_POSITIONS = 1 << 24

LAYER_KEYS = ("num_hidden_layers", "num_layers", "num_decoder_layers", "n_layer", "encoder_layers", "decoder_layers")
"""config.json keys that count layers, across model families."""
RANGES = {
    **dict.fromkeys(LAYER_KEYS, MAX_LAYERS),
    **dict.fromkeys(("hidden_size", "intermediate_size", "head_dim", "n_embd", "n_inner", "d_model", "d_ff", "d_kv",
                     "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "word_embed_proj_dim"), MAX_WIDTH),
    **dict.fromkeys(("num_attention_heads", "num_key_value_heads", "n_head", "num_heads", "encoder_attention_heads",
                     "decoder_attention_heads"), MAX_HEADS),
    "vocab_size": MAX_VOCAB,
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx"), MAX_POSITIONS),
}
"""Each size key and its largest value (the smallest is 1)."""
OPTIONAL = ("num_key_value_heads", "head_dim", "n_inner", "num_decoder_layers")
"""Size keys that may be null: the family's default (all heads, width / heads, 4 x width, the encoder's count)."""
ROPE_KEYS = ("rope_scaling", "rope_parameters")


def check_values(path: Path, config: dict[str, Any]) -> None:
    """Every size of `config` (read from `path`) in its range, its RoPE scaling one `transformers` knows."""
    for key, top in RANGES.items():
        if key not in config or (config[key] is None and key in OPTIONAL):
            continue
        value = config[key]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
            raise InputError(f"{path}: {key} {value!r}: a size must be a whole number from 1 to {top}; restore "
                             "config.json as the model was saved")
    for key in ROPE_KEYS:
        if config.get(key) is not None:
            check_rope(path, key, config[key])


def check_rope(path: Path, key: str, value: Any) -> None:
    """A RoPE scaling table whose type (`rope_type`, or the older `type`) `transformers` has a rotation for."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if not isinstance(value, dict):
        raise InputError(f"{path}: {key}: {value!r} is not a table (a JSON object with a rope_type); restore "
                         "config.json as the model was saved")
    known = ("default", *sorted(ROPE_INIT_FUNCTIONS))
    kind = value.get("rope_type", value.get("type", "default"))
    if kind not in known:
        raise InputError(f"{path}: {key}: rope type {kind!r} is not one of {', '.join(known)}; restore config.json "
                         "as the model was saved")
