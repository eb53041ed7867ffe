"""The optional libraries, imported in one place: each missing one is the one line naming the extra that
installs it (`MissingExtra`), never a bare ImportError deep in a load.

`transformers` (the `hf` extra) is imported here rather than through the module that registers EVA
with it, so that checking or loading a plain Hugging Face folder does not pull in EVA's attention.
"""

from __future__ import annotations

import importlib
import importlib.util

from evalm.config_toolkit.errors import MissingExtra


def transformers_module():
    """`transformers`, or the one line naming the extra that installs it."""
    try:
        return importlib.import_module("transformers")
    except ImportError as err:
        raise MissingExtra("Hugging Face models (--hf-model, evalm convert, EVA in transformers) need the optional "
                           "extra: pip install 'evalm[hf]'") from err


def require_gguf() -> None:
    """`--gguf-file` reads through transformers' GGUF loader, which needs the `gguf` package (the
    `smollm` extra); without it transformers raises a bare ImportError deep in loading."""
    if importlib.util.find_spec("gguf") is None:
        raise MissingExtra("--gguf-file: reading a GGUF file needs the gguf package: "
                           "pip install 'evalm[smollm]' (or pip install 'gguf>=0.10')")
