"""The attention variants by their `ModelConfig.attention` name: the one place a variant is registered.

`ModelConfig` refuses any other name, listing these; `Block` builds `ATTENTION[config.attention]`.
A variant is an `nn.Module` built as `cls(config, layer_idx)` with `init_weights()` and
`forward(x, cache=None)`; with a cache it keeps its per-layer state in `cache.layers[layer_idx]`, a
`LayerState` (evalm/cache.py). docs/model.md, "Adding an attention variant", walks through one.
"""

from __future__ import annotations

from torch import nn

from evalm.eva import EvaAttention
from evalm.full_attention import FullAttention
from evalm.window_attention import WindowAttention

ATTENTION: dict[str, type[nn.Module]] = {"eva": EvaAttention, "full": FullAttention, "window": WindowAttention}
