"""EVALM: a causal decoder with EVA attention, circular positions and an incremental-encoding cache.

Public surface: `ModelConfig`, `EvalmModel` (with `new_cache`), `load_model`, `save_model`, and
`register_with_transformers()` (EVA and evalm's model classes in `transformers`, evalm/hf_register.py).

`evalm` is also the project's one import name: the other floors are its parts `evalm.data_pipeline`,
`evalm.train`, `evalm.icl_eval`, `evalm.launcher` and `evalm.config_toolkit`, installed from the
repository's top-level folders of those names (pyproject.toml). The names below are therefore
loaded on first use (PEP 562), so that `import evalm.data_pipeline` loads no torch (its floor rule),
and `import evalm` no transformers.
"""

from __future__ import annotations

import importlib

_LAZY = {"ModelConfig": "evalm.config", "EvalmModel": "evalm.model",
         "register_with_transformers": "evalm.hf_register"}
__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'evalm' has no attribute {name!r}")
