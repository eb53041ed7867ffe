"""The private attributes of `transformers` evalm writes, in one place, each with its reason.

transformers (4.56 to 5.x) gives no public way to do either of these without side effects evalm
must avoid; a later version that changes them breaks here and nowhere else.

- `config._attn_implementation`: the attention function a model's layers call. EVA's classes set
  "eva" whatever loading asked for (the same weights with softmax attention are a plain Llama), and
  attention transfer swaps in its own function for a run. The public `set_attn_implementation`
  validates against the library's built-in names and, in some versions, reloads kernels.
- `cls._auto_class`: a class once loaded with remote code is marked for an Auto class, and
  `save_pretrained` would then copy evalm's source into the folder and point `auto_map` at it;
  `evalm convert` writes its own pinned modeling file instead, so the mark is lifted while it saves.
- `model.hf_quantizer` / `is_quantized`: a GGUF file loaded in float32 is dequantised, yet the model keeps
  its quantizer and `save_pretrained` would write it as quantized; `evalm convert --prepare` saves it as the
  plain float32 model it is (there is no public "forget the quantizer").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


def set_attention(config, name: str) -> None:
    """Make every layer of a model with `config` call the attention function registered as `name`."""
    config._attn_implementation = name


@contextlib.contextmanager
def unmarked(*classes: type) -> Iterator[None]:
    """Within the block, `classes` carry no Auto-class mark of remote code (restored after)."""
    marks = {cls: cls.__dict__["_auto_class"] for cls in classes if "_auto_class" in cls.__dict__}
    for cls in marks:
        cls._auto_class = None
    try:
        yield
    finally:
        for cls, mark in marks.items():
            cls._auto_class = mark


def dequantised(model):
    """A model dequantised on load (a GGUF read in float32) as a plain model: no quantizer, no quantization
    config, so `save_pretrained` writes its float tensors as they are. Returns `model`."""
    model.hf_quantizer, model.is_quantized = None, False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model
