"""`EvaCache`: `transformers`' `Cache` API over evalm's incremental-encoding cache (evalm/cache.py).

`generate()` and a model's forward see a `Cache` of one layer object per decoder layer; inside is
one evalm `Cache` (`state`), the very object `EvalmModel` uses: per layer an `EvaState` (the window
K/V of the current block, the queries of the incomplete chunk, one k̃ and β per completed chunk),
so after n tokens a layer holds n // c chunk summaries, at most ext + w window rows and fewer than
c pending queries: memory linear in n, c times smaller than a plain K/V cache (docs/eva.md, "The
cache"). Forks, batches of forks and Structured Prompting's merge are evalm's own (`fork`, `merge`).

How the attention reaches its layer: `transformers` calls `cache.update(key, value, layer_idx)`
just before the attention function, which receives what `update` returns. `EvaLayer.update`
returns the new key heads as a fresh view tagged with the layer (`hf_attention.CARRIER`); the "eva"
attention (evalm/hf_attention.py) continues that layer's state and, after the last layer, the
cache advances by the new tokens, as `EvalmModel.forward` advances its cache.

Not supported, each refused in one line: beam search (`reorder_cache`), rolling back tokens
(`crop`: assisted decoding), selecting rows of a batch.
"""

from __future__ import annotations

import inspect

from torch import Tensor

from evalm.cache import Cache as EvalmCache
from evalm.cache import merge as merge_states
from evalm.config_toolkit import ConfigError
from evalm.config_toolkit import transformers_module
from evalm.hf_attention import CARRIER

tf = transformers_module()
try:  # transformers >= 4.56: a cache is a list of layer objects
    from transformers.cache_utils import CacheLayerMixin as _LayerBase
except ImportError:
    _LayerBase = object

CACHE_ARG = ("cache" if "cache" in inspect.signature(tf.GenerationMixin.prepare_inputs_for_generation).parameters
             else "past_key_values")
"""What this transformers calls the cache argument of `generate()` and a forward (`cache` from 5.x)."""


def _unsupported(what: str):
    raise ConfigError(f"EVA's cache cannot {what}: its chunk summaries are not per-token rows; use greedy or "
                      "sampled decoding with num_beams=1 and no assistant model")


class EvaLayer(_LayerBase):
    """One decoder layer's view of an `EvaCache`: what `transformers` asks of a cache layer."""

    is_compileable = False
    is_sliding = False
    is_croppable = False
    supports_early_init = False

    def __init__(self, owner: EvaCache, layer_idx: int):
        self.owner, self.layer_idx = owner, layer_idx
        self.keys = self.values = None  # transformers' own layers keep K/V here; EVA's state is in `owner.state`
        self.is_initialized = True

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        pass

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        """The new heads, the keys tagged with this layer for the "eva" attention function."""
        if self.layer_idx == 0:
            self.owner.begin(key_states.shape[0])
        keys = key_states.view_as(key_states)  # a new tensor object: the caller's keys stay untagged
        setattr(keys, CARRIER, self)
        return keys, value_states

    def state_cache(self) -> EvalmCache:
        """The evalm cache the attention continues (`EvaAttention.attend`)."""
        return self.owner.state

    def attended(self, n_tokens: int) -> None:
        """Called by the attention after it updated this layer; the last layer advances the cache."""
        if self.layer_idx == self.owner.state.n_layer - 1:
            self.owner.state.advance(n_tokens)

    @property
    def batch_size(self) -> int:
        return self.owner.state.batch_size

    def get_seq_length(self) -> int:
        return self.owner.state.n_seen

    def get_mask_sizes(self, query_length: int | Tensor) -> tuple[int, int]:
        return self.owner.get_mask_sizes(query_length)

    def get_max_length(self) -> int:
        return -1

    def get_max_cache_shape(self) -> int:  # transformers < 5's name
        return -1

    def reset(self) -> None:
        self.owner.reset()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove:
            _unsupported("remove tokens (crop)")

    def reorder_cache(self, beam_idx) -> None:
        _unsupported("reorder beams")

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.layer_idx == 0:
            self.owner.repeat(repeats)

    def batch_select_indices(self, indices) -> None:
        _unsupported("select rows of a batch")

    def offload(self) -> None:
        pass

    def prefetch(self) -> None:
        pass


class EvaCache(tf.Cache):
    """`transformers`' `Cache` over one evalm cache: pass it as `cache=` / `past_key_values=`;
    evalm's model classes make one themselves. `n_layer`: the model's decoder layers."""

    def __init__(self, n_layer: int, batch_size: int = 1, position_offset: int = 0, state: EvalmCache | None = None):
        layers = [EvaLayer(self, i) for i in range(n_layer)]
        try:
            super().__init__(layers=layers)
        except TypeError:  # transformers < 4.56: a cache is not a list of layer objects
            super().__init__()
            self.layers = layers
        self.state = state if state is not None else EvalmCache(n_layer, batch_size, position_offset)

    @classmethod
    def for_config(cls, config, batch_size: int = 1) -> EvaCache:
        """An empty cache for a model of this `transformers` config."""
        return cls(config.get_text_config().num_hidden_layers, batch_size=batch_size)

    @classmethod
    def continuing(cls, cache, use_cache: bool, config) -> EvaCache | None:
        """The cache an EVA forward continues: `cache` if it is an `EvaCache`; in place of an empty
        cache of another kind (the one `generate()` makes), or of none with `use_cache`, a new one.
        A filled cache of another kind is refused: it kept no queries, which the summaries need."""
        if isinstance(cache, EvaCache):
            return cache
        if cache is not None and cache.get_seq_length() > 0:
            raise ConfigError(f"an EVA model cannot continue a {type(cache).__name__} that holds tokens: "
                              "pass an evalm.hf_cache.EvaCache")
        return cls.for_config(config) if (use_cache or cache is not None) else None

    def begin(self, batch_size: int) -> None:
        """A forward starts: an empty cache takes the batch's size; a filled one must match it."""
        if self.state.n_seen == 0 and all(s is None for s in self.state.layers):
            self.state.batch_size = batch_size
        elif batch_size != self.state.batch_size:
            raise ValueError(f"tokens have batch {batch_size} but the cache holds {self.state.batch_size}: "
                             f"fork(batch_size={batch_size}) first")

    def repeat(self, repeats: int) -> None:
        """`generate`'s expansion of a batch-1 prompt to several sequences: evalm's broadcasting fork."""
        if repeats != 1:
            self.state = self.state.fork(batch_size=self.state.batch_size * repeats)

    def fork(self, batch_size: int | None = None) -> EvaCache:
        """An independent child (`batch_size` children broadcast from a batch-1 parent): evalm's fork."""
        return EvaCache(self.state.n_layer, state=self.state.fork(batch_size))

    @staticmethod
    def merge(caches: list[EvaCache], own_logit_bias: float = 0.0, position_offset: int | None = None) -> EvaCache:
        """Structured Prompting's merge of batch-1 caches (evalm.cache.merge)."""
        state = merge_states([c.state for c in caches], own_logit_bias, position_offset)
        return EvaCache(state.n_layer, state=state)

    def nbytes(self) -> int:
        return int(self.state.nbytes())

    def reset(self) -> None:
        self.state = EvalmCache(self.state.n_layer, self.state.batch_size, self.state.position_offset)

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args, **kwargs) -> tuple[Tensor, Tensor]:
        return self.layers[layer_idx].update(key_states, value_states)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.state.n_seen

    def get_mask_sizes(self, query_length: int | Tensor, layer_idx: int = 0) -> tuple[int, int]:
        """(keys a mask covers, their offset); transformers < 5 passes the new tokens' positions instead of their count."""
        n_new = query_length.shape[-1] if isinstance(query_length, Tensor) else query_length
        return self.state.n_seen + n_new, 0

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:  # transformers < 4.56's name
        return -1

    @property
    def batch_size(self) -> int:
        return self.state.batch_size

    @property
    def is_compileable(self) -> bool:
        return False
