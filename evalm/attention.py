"""The attention variants by their `ModelConfig.attention` name: the one place a variant is registered.

`ModelConfig` refuses any other name, listing these; `Block` builds `attention_class(config.attention)`.
A variant is an `nn.Module` built as `cls(config, layer_idx)` with `init_weights()` and
`forward(x, cache=None)`; with a cache it keeps its per-layer state in `cache.layers[layer_idx]`, a
`LayerState` (evalm/cache.py). docs/model.md, "Adding an attention variant", walks through one.

The dict names each class by its import path, so the config that validates names (evalm/config.py)
imports no torch: `python -c "import evalm.config"` stays light, as a model's config is data.
"""

from __future__ import annotations

import importlib

ATTENTION: dict[str, str] = {"eva": "evalm.eva:EvaAttention", "full": "evalm.full_attention:FullAttention",
                             "window": "evalm.window_attention:WindowAttention"}


def attention_class(name: str) -> type:
    """The class registered under `name` (imported on first use)."""
    module, cls = ATTENTION[name].split(":")
    return getattr(importlib.import_module(module), cls)
