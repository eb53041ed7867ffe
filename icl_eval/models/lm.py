"""The language-model interface the methods drive, and its `EvalmModel` implementation.

Every method is written once against `CausalLM`: a one-shot `forward`, and a cache that can be
extended, forked (copy-on-write; a batch of children broadcast from one parent) and merged
(Structured Prompting / SAICL). `EvalmLM` maps it onto `EvalmModel` and `evalm.cache`; `HFCausalLM`
(`icl_eval/models/hf.py`) onto a Hugging Face causal LM's `past_key_values`.

Caches are mutable: `extend(state, tokens)` advances `state`. Always `fork` before extending a
state that must be reused. Everything runs under `torch.no_grad()` in eval mode.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor


class CausalLM(Protocol):
    name: str
    """What the results record as the model (a folder, or a description)."""
    tokenizer: Any
    """`.encode`, `.decode`, `.eos_id`, `.vocab_size` (evalm.text.tokenizer's interface)."""
    max_positions: int | None
    """The window: positions the model can take in one sequence; None means no limit (EVALM)."""
    device: torch.device

    def forward(self, tokens: Tensor) -> Tensor:
        """(B, T) long, right-padded -> logits (B, T, V), no cache (the `concat` path)."""

    def new_state(self, position_offset: int = 0) -> Any:
        """An empty batch-1 cache whose first token sits at `position_offset`."""

    def extend(self, state: Any, tokens: Tensor) -> Tensor:
        """Encode (B, T) tokens after everything in `state` (advancing it) -> logits (B, T, V)."""

    def fork(self, state: Any, batch_size: int = 1) -> Any:
        """An independent child (or `batch_size` children of a batch-1 parent); the parent is untouched."""

    def merge(self, states: list[Any], own_logit_bias: float, position_offset: int) -> Any:
        """A cache whose tokens attend to every state's entries plus their own (own logits + bias)."""

    def nbytes(self, state: Any) -> int:
        """Bytes held by a cache."""

    def with_model(self, model) -> CausalLM:
        """The same wrapper (tokenizer, name, window) over other weights of the same architecture (a
        fine-tuned copy: icl_eval/methods/finetune.py)."""


class EvalmLM:
    """`CausalLM` over an `EvalmModel` (EVA or full attention)."""

    def __init__(self, model, tokenizer, name: str = "evalm", max_positions: int | None = None):
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.max_positions = max_positions
        self.device = next(model.parameters()).device
        self.config = model.config

    def with_model(self, model) -> EvalmLM:
        return EvalmLM(model, self.tokenizer, self.name, self.max_positions)

    def describe(self) -> dict[str, Any]:
        from evalm.config_toolkit import to_dict

        return {"kind": "evalm", "name": self.name, "config": to_dict(self.config)}

    @torch.no_grad()
    def forward(self, tokens: Tensor) -> Tensor:
        return self.model(tokens.to(self.device))

    def new_state(self, position_offset: int = 0):
        return self.model.new_cache(batch_size=1, position_offset=position_offset)

    @torch.no_grad()
    def extend(self, state, tokens: Tensor) -> Tensor:
        return self.model(tokens.to(self.device), cache=state)

    def fork(self, state, batch_size: int = 1):
        return state.fork(batch_size=batch_size)

    def merge(self, states, own_logit_bias: float, position_offset: int):
        from evalm.cache import merge

        return merge(list(states), own_logit_bias=own_logit_bias, position_offset=position_offset)

    def nbytes(self, state) -> int:
        return int(state.nbytes())


def right_pad(rows: list[list[int]] | list[tuple[int, ...]], pad_id: int) -> Tensor:
    """(B, T) long, each row followed by `pad_id` (right padding: never shifts positions or blocks)."""
    width = max(len(r) for r in rows)
    out = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out
