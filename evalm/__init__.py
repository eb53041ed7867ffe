"""EVALM: a causal decoder with EVA attention, circular positions and an incremental-encoding cache.

Public surface: `ModelConfig`, `EvalmModel` (with `new_cache`), `load_model`, `save_model`.
"""

from evalm.config import ModelConfig
from evalm.model import EvalmModel

__all__ = ["ModelConfig", "EvalmModel"]
