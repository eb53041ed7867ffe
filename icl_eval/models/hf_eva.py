"""`CausalLM` over a `transformers` model with EVA attention: its state is evalm's `EvaCache`.

A folder of model_type "evalm" (`evalm export --hf`) or "eva_llama" (a Llama with EVA) loads
through `--hf-model` into evalm's own classes (`evalm.register_with_transformers()`; no code from
the folder runs), and the evaluator drives it as it drives `EvalmModel`: the cache is the
`EvaCache` `generate()` uses, an evalm `Cache` inside, so extending, forking (a batch of forks
broadcast from one parent, their short inputs folded over its chunk summaries), Structured
Prompting's merge and `nbytes` are evalm's own, in memory linear in the context (`icl_eval/models/
lm.py`'s interface). No window: EVA has none (`max_positions` None unless `--context-window`).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import Tensor

EVA_MODEL_TYPES = ("evalm", "eva_llama")
"""model_type values of folders built into evalm's classes (`models.hf.load_hf` reads it from the config it checks)."""


class EvaHFCausalLM:
    """`CausalLM` (icl_eval/models/lm.py) over an EVA `transformers` model and its `EvaCache`."""

    def __init__(self, model, tokenizer, name: str = "hf-eva", max_positions: int | None = None):
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        self.max_positions = max_positions
        self.device = next(model.parameters()).device
        parameters = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in parameters else "past_key_values"

    def with_model(self, model) -> EvaHFCausalLM:
        return EvaHFCausalLM(model, self.tokenizer, self.name, self.max_positions)

    def describe(self) -> dict[str, Any]:
        return {"kind": "hf-eva", "name": self.name, "model_type": self.model.config.model_type,
                "evalm": dict(self.model.config.evalm), "n_params": sum(p.numel() for p in self.model.parameters())}

    @torch.no_grad()
    def forward(self, tokens: Tensor) -> Tensor:
        return self.model(input_ids=tokens.to(self.device), use_cache=False).logits

    def new_state(self, position_offset: int = 0):
        from evalm.hf_cache import EvaCache

        return EvaCache(self.model.config.num_hidden_layers, position_offset=position_offset)

    @torch.no_grad()
    def extend(self, state, tokens: Tensor) -> Tensor:
        """Encode (B, T) tokens after `state` (advancing it); positions from the cache's own count,
        its offset included (a merged cache's test tokens sit after its groups)."""
        tokens = tokens.to(self.device)
        B, T = tokens.shape
        start = state.state.get_pos()
        positions = torch.arange(start, start + T, device=self.device).expand(B, T)
        out = self.model(input_ids=tokens, position_ids=positions, use_cache=True, **{self._cache_arg: state})
        return out.logits

    def fork(self, state, batch_size: int = 1):
        return state.fork(batch_size=batch_size)

    def merge(self, states, own_logit_bias: float, position_offset: int):
        from evalm.hf_cache import EvaCache

        return EvaCache.merge(list(states), own_logit_bias=own_logit_bias, position_offset=position_offset)

    def nbytes(self, state) -> int:
        return state.nbytes()
