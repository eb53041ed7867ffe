"""Decoding through the cache for `generate_until` (icl_eval/harness.py): greedy, or sampled with a seed.

A harness request carries generation kwargs. `GenerationSettings.from_request` reads them the way
lm-eval's HF backend does (`lm_eval.models.utils.normalize_gen_kwargs`, lm-eval 0.4.13):

- the token budget from `max_gen_toks`, else its aliases `max_new_tokens`, `max_tokens`,
  `max_completion_tokens` (in that priority), else the model's default (256);
- `do_sample` unset means sampling exactly when `temperature > 0`; `do_sample=False` is greedy
  whatever the temperature; `do_sample=True` needs a positive temperature (refused otherwise:
  HF's generate would sample at temperature 0 through a division by zero);
- `top_k`, `top_p` filter the sampled distribution; any other key is refused by name rather than
  silently ignored (e.g. `num_beams`).

Greedy output equals HF `generate`'s token for token (tests/icl_eval/test_harness_hf.py). Sampled
output is reproducible for a given seed and request order, but it is not HF's draw: HF's generate
consumes the global RNG and applies the model's own generation config (GPT-2: top_k=50).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from evalm.config_toolkit import ConfigError

MAX_TOKEN_KEYS = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")
KNOWN_KEYS = {"until", "do_sample", "temperature", "top_k", "top_p", *MAX_TOKEN_KEYS}


@dataclass(frozen=True)
class GenerationSettings:
    max_new_tokens: int = 256
    until: tuple[str, ...] = ()
    do_sample: bool = False
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None

    @classmethod
    def from_request(cls, gen_kwargs: Mapping[str, Any], default_max: int = 256) -> GenerationSettings:
        unknown = sorted(set(gen_kwargs) - KNOWN_KEYS)
        if unknown:
            raise ConfigError(f"generate_until: generation kwargs {unknown} are not supported (supported: "
                              f"{sorted(KNOWN_KEYS)}); remove them from the task's generation_kwargs")
        given = [gen_kwargs[k] for k in MAX_TOKEN_KEYS if gen_kwargs.get(k) is not None]
        until = gen_kwargs.get("until") or []
        temperature = float(gen_kwargs.get("temperature") or 0.0)
        do_sample = gen_kwargs.get("do_sample")
        do_sample = temperature > 0.0 if do_sample is None else bool(do_sample)
        if do_sample and temperature <= 0.0:
            raise ConfigError("generate_until: do_sample=True needs temperature > 0 (got "
                              f"{temperature}); set a temperature, or do_sample=False for greedy decoding")
        top_k = gen_kwargs.get("top_k")
        top_p = gen_kwargs.get("top_p")
        return cls(int(given[0]) if given else default_max, (until,) if isinstance(until, str) else tuple(until),
                   do_sample, temperature if do_sample else 0.0, None if top_k is None else int(top_k),
                   None if top_p is None else float(top_p))


def next_token(logits: torch.Tensor, settings: GenerationSettings, generator: torch.Generator | None) -> int:
    """The next token from (V,) logits: the argmax, or a draw from softmax(logits / T) after top-k / top-p."""
    if not settings.do_sample:
        return int(logits.argmax())
    scaled = logits.double() / settings.temperature
    if settings.top_k:
        kth = torch.topk(scaled, min(settings.top_k, scaled.numel())).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if settings.top_p is not None and settings.top_p < 1.0:
        order = scaled.argsort(descending=True)
        cum = torch.softmax(scaled[order], -1).cumsum(-1)
        drop = cum - torch.softmax(scaled[order], -1) >= settings.top_p  # keep the smallest set reaching top_p
        scaled[order[drop]] = float("-inf")
    probs = torch.softmax(scaled, -1).cpu()
    return int(torch.multinomial(probs, 1, generator=generator))


def generate(lm, context: Sequence[int], settings: GenerationSettings, stop: Callable[[list[int]], bool] = lambda ids: False,
             segment_tokens: int = 4096, generator: torch.Generator | None = None) -> list[int]:
    """Decoding through the cache: the context is encoded once, then one token per step, up to eos or
    `settings.max_new_tokens`."""
    if not context:
        raise ValueError("generate needs at least one context token (e.g. the bos token)")
    state = lm.new_state(0)
    logits = None
    for i in range(0, len(context), segment_tokens):
        logits = lm.extend(state, torch.tensor([list(context[i : i + segment_tokens])], dtype=torch.long))
    return decode_from(lm, state, logits, settings, stop, generator)


def decode_from(lm, state, logits: torch.Tensor, settings: GenerationSettings,
                stop: Callable[[list[int]], bool] = lambda ids: False,
                generator: torch.Generator | None = None) -> list[int]:
    """Decoding after a context already in `state` (advanced as it goes), `logits` (1, T, V) its last
    forward's: one token per step, up to eos, `stop` or `settings.max_new_tokens`."""
    out: list[int] = []
    for _ in range(settings.max_new_tokens):
        nxt = next_token(logits[0, -1], settings, generator)
        if nxt == lm.tokenizer.eos_id:
            break
        out.append(nxt)
        if stop(out):
            break
        logits = lm.extend(state, torch.tensor([[nxt]], dtype=torch.long))
    return out
