"""`CausalLM` over a Hugging Face causal LM from a local folder (OPT/GPT-2 style), K/V through `past_key_values`.

The paper's OPT baseline, and any `AutoModelForCausalLM` that takes `position_ids` and a 4-D
additive attention mask (GPT-2, OPT, Llama/SmolLM2). EVA folders take icl_eval/models/hf_eva.py. Imported lazily: `transformers` is the
optional extra `hf`; nothing here touches a hub (`local_files_only=True`).

The cache is our own small object holding each layer's (K, V) of shape (B, H, S, D); each call
wraps it in a `DynamicCache`, runs the model, and keeps the returned tensors. `DynamicLayer.update`
concatenates (new tensors), so a fork is a shallow copy and the parent is never mutated.
A merged cache (Structured Prompting) holds the groups' K/V as its first `prefix_len` entries; its
own tokens attend to them and to themselves through an explicit 4-D mask that adds
`own_logit_bias` to their own keys' logits (Eq. 2's log M) and masks the future.

Logits come back in the model's dtype (a float64 model scores exactly; the scorers widen bf16/fp16
to float32). The prompts' BOS is the model's own (`HFTokenizerAdapter.default_bos`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor

from evalm.config_toolkit import ConfigError, InputError, transformers_module


@dataclasses.dataclass
class HFState:
    """Per layer (K, V) (B, H, S, D); the next token's position is position_offset + n_seen."""

    layers: list[tuple[Tensor, Tensor]]
    position_offset: int = 0
    n_seen: int = 0
    prefix_len: int = 0
    """Entries [0, prefix_len) came from merged groups: no bias, always visible."""
    own_logit_bias: float = 0.0

    @property
    def batch_size(self) -> int:
        return self.layers[0][0].shape[0] if self.layers else 1

    @property
    def n_entries(self) -> int:
        return self.layers[0][0].shape[-2] if self.layers else 0


class HFTokenizerAdapter:
    """evalm.text.tokenizer's interface over a `transformers` tokenizer."""

    def __init__(self, tok):
        self._tok = tok
        self.vocab_size = len(tok)
        eos = tok.eos_token_id if tok.eos_token_id is not None else tok.bos_token_id
        if eos is None:
            raise InputError("the tokenizer has neither an eos nor a bos token")
        self.eos_id = int(eos)
        self.name = getattr(tok, "name_or_path", type(tok).__name__)

    def encode(self, text: str) -> list[int]:
        return list(self._tok(text, add_special_tokens=False)["input_ids"])

    def default_bos(self) -> tuple[tuple[int, ...], str]:
        """What a document started with in the model's training, as far as its tokenizer tells:

        1. the token(s) the tokenizer prepends itself (Llama, Mistral, Gemma: `<s>`, `<bos>`);
        2. else its declared `bos_token` when that is not also its eos (SmolLM2-Instruct: `<|im_start|>`);
        3. else none: a GPT-2-style model's one special token `<|endoftext|>` ends documents and was
           never prepended to one (lm-eval's HF backend adds no BOS for it either)."""
        tok = self._tok
        plain = self.encode("x")
        full = list(tok("x", add_special_tokens=True)["input_ids"])
        if len(full) > len(plain) and full[len(full) - len(plain):] == plain:
            lead = tuple(full[: len(full) - len(plain)])
            return lead, f"the tokenizer prepends {tok.convert_ids_to_tokens(list(lead))} itself"
        bos, eos = tok.bos_token_id, tok.eos_token_id
        if bos is not None and bos != eos:
            return (int(bos),), f"the tokenizer's bos_token {tok.bos_token!r} (not its eos)"
        return (), "none: the tokenizer prepends nothing and has no bos apart from its eos (GPT-2 style)"

    def token_id(self, text: str) -> int | None:
        """The id of one vocabulary entry spelled `text` (special tokens included), else None."""
        found = self._tok.convert_tokens_to_ids(text)
        unk = self._tok.unk_token_id
        return None if found is None or (found == unk and text != self._tok.unk_token) else int(found)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids))


class HFCausalLM:
    """`CausalLM` (icl_eval/models/lm.py) over a `transformers` causal LM."""

    def __init__(self, model, tokenizer, name: str = "hf", max_positions: int | None = None):
        self.model, self.tokenizer, self.name = model.eval(), tokenizer, name
        config = model.config
        window = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        self.max_positions = max_positions or window
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype

    def with_model(self, model) -> HFCausalLM:
        return HFCausalLM(model, self.tokenizer, self.name, self.max_positions)

    def describe(self) -> dict[str, Any]:
        return {"kind": "hf", "name": self.name, "model_type": self.model.config.model_type,
                "max_positions": self.max_positions, "n_params": sum(p.numel() for p in self.model.parameters())}

    @torch.no_grad()
    def forward(self, tokens: Tensor) -> Tensor:
        tokens = tokens.to(self.device)
        positions = torch.arange(tokens.shape[1], device=self.device).expand_as(tokens)
        return self.model(input_ids=tokens, position_ids=positions, use_cache=False).logits

    def new_state(self, position_offset: int = 0) -> HFState:
        return HFState(layers=[], position_offset=position_offset)

    @torch.no_grad()
    def extend(self, state: HFState, tokens: Tensor) -> Tensor:
        tf = transformers_module()
        tokens = tokens.to(self.device)
        B, T = tokens.shape
        if state.layers and state.batch_size != B:
            raise ValueError(f"tokens have batch {B} but the cache holds {state.batch_size}: fork(batch_size={B}) first")
        start = state.position_offset + state.n_seen
        positions = torch.arange(start, start + T, device=self.device).expand(B, T)
        past = tf.DynamicCache(ddp_cache_data=state.layers) if state.layers else tf.DynamicCache()
        mask = self._mask(state, B, T) if (state.prefix_len or state.own_logit_bias) else None
        out = self.model(input_ids=tokens, position_ids=positions, attention_mask=mask, past_key_values=past,
                         use_cache=True)
        state.layers = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        state.n_seen += T
        return out.logits  # the model's own dtype: scoring widens to float32, float64 stays exact

    def _mask(self, state: HFState, B: int, T: int) -> Tensor:
        """(B, 1, T, S + T) additive mask: 0 on group entries, own_logit_bias on own visible keys, min on the future."""
        S = state.n_entries
        neg = torch.finfo(self.dtype).min
        mask = torch.full((T, S + T), state.own_logit_bias, dtype=self.dtype, device=self.device)
        mask[:, : state.prefix_len] = 0.0
        future = torch.ones(T, T, dtype=torch.bool, device=self.device).triu(1)
        mask[:, S:] = mask[:, S:].masked_fill(future, neg)
        return mask.expand(B, 1, T, S + T)

    def fork(self, state: HFState, batch_size: int = 1) -> HFState:
        layers = state.layers
        if batch_size != state.batch_size:
            if state.batch_size != 1:
                raise ValueError(f"fork(batch_size={batch_size}) needs a batch-1 parent, not {state.batch_size}")
            layers = [(k.expand(batch_size, *k.shape[1:]), v.expand(batch_size, *v.shape[1:])) for k, v in layers]
        return dataclasses.replace(state, layers=list(layers))

    def merge(self, states: list[HFState], own_logit_bias: float, position_offset: int) -> HFState:
        if any(s.batch_size != 1 for s in states):
            raise ValueError("merge needs batch-1 caches")
        filled = [s for s in states if s.layers]
        layers = [
            (torch.cat([s.layers[i][0] for s in filled], -2), torch.cat([s.layers[i][1] for s in filled], -2))
            for i in range(len(filled[0].layers))
        ] if filled else []
        prefix = layers[0][0].shape[-2] if layers else 0
        return HFState(layers=layers, position_offset=position_offset, prefix_len=prefix, own_logit_bias=own_logit_bias)

    def nbytes(self, state: HFState) -> int:
        seen, total = set(), 0
        for k, v in state.layers:
            for t in (k, v):
                ptr = t.untyped_storage().data_ptr()
                if ptr not in seen:
                    seen.add(ptr)
                    total += t.untyped_storage().nbytes()
        return total


def load_hf(folder, tokenizer=None, dtype: str = "float32", device: str = "cpu", gguf_file: str | None = None,
            attn_implementation: str = "sdpa") -> HFCausalLM:
    """A causal LM (and its tokenizer, unless one is given) from a local folder (a path, or the
    `evalm.hf_folder.CheckedFolder` of this load, not checked again); never the network. An EVA folder
    (model_type "evalm" or "eva_llama") loads into evalm's classes with EVA's cache
    (icl_eval/models/hf_eva.py), whatever `attn_implementation` says."""
    from evalm import hf_folder
    from evalm.icl_eval.models.hf_eva import EVA_MODEL_TYPES, EvaHFCausalLM

    tf = transformers_module()
    checked = hf_folder.gate(folder, gguf_file)  # evalm's classes registered for an EVA folder
    folder, gguf_file = checked.path, checked.gguf_file
    eva = checked.config.get("model_type") in EVA_MODEL_TYPES
    if eva:
        attn_implementation = "eva"
    try:  # no code from the folder, its weights checked against its config.json first (evalm.hf_folder)
        model = hf_folder.model(tf.AutoModelForCausalLM, checked, dtype=getattr(torch, dtype), device=device,
                                attn_implementation=attn_implementation).to(device)
    except ConfigError as err:  # an EVA config's refusal names its field; here also the folder
        raise ConfigError(str(err).replace("config.json", str(folder / "config.json"), 1)) from None
    if tokenizer is None:
        tokenizer = HFTokenizerAdapter(hf_folder.tokenizer(checked))
    if eva:
        return EvaHFCausalLM(model, tokenizer, name=str(folder))
    return HFCausalLM(model, tokenizer, name=str(folder / gguf_file) if gguf_file else str(folder))
