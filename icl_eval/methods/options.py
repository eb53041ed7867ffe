"""What every ICL method takes and returns: `MethodOptions`, `MethodResult`, the progress hook and
`PromptTooLong` (docs/evaluation.md). A module of its own so that the decoder methods (methods.py) and
their encoder-decoder forms (encdec_methods.py) both build on it, and neither on the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic.dataclasses import dataclass as pydantic_dataclass

from evalm.config_toolkit import ConfigError, FROZEN, UserError
from evalm.icl_eval.methods.scoring import RULES


class PromptTooLong(UserError, ValueError):
    """A prompt that does not fit the model's window (never truncated silently)."""


MAX_GROUPS = 65_536
"""Structured Prompting groups at most: `n_groups = 1e9` built a billion group lists before the first score."""


@pydantic_dataclass(config=FROZEN, frozen=True)
class MethodOptions:
    """Knobs of the methods; each method reads only its own."""

    scoring: str = "instance-sum"
    """One of scoring.RULES."""
    on_overflow: Literal["error", "drop_left"] = "error"
    """concat/incremental past the window: raise, or drop demonstrations from the left and record it."""
    segment_tokens: int = 4096
    """Contexts are encoded into the cache in segments of this many tokens (exact; bounds memory)."""
    group_tokens: int | None = None
    """structured: token budget L of a group (filled with as many whole demonstrations as fit)."""
    n_groups: int | None = None
    """structured/ensemble: split the demonstrations into this many groups instead (near-equal counts)."""
    align: Literal["mask", "pad_space", "truncate", "none"] = "mask"
    """structured/saicl right-alignment (Structured Prompting Table 5); `none` is the ablation."""
    rescale: str = "log_m"
    """structured: bias on the test tokens' own logits: `log_m`, `off`, or a number."""
    saicl_rescale: bool = False
    """saicl: also add log M (SAICL has no rescale; this is the Structured-Prompting hybrid)."""
    test_prefix: Literal["shared", "reencode"] = "shared"
    """After a cache: encode the candidates' shared test prefix once per item and fork it per candidate
    (`icl_eval/methods/item_scoring.py`), or feed every candidate whole (the old way; same scores, K times the work)."""
    ensemble_reduce: Literal["mean_score", "mean_prob", "mean_logits"] = "mean_score"
    """ensemble: mean of the per-group scores (log-probabilities or logits), log of the mean probability,
    or SAICL §5.3's mean of the groups' logits at every position, scored once (`mean_logits`)."""
    finetune: Literal["full", "lora"] = "full"
    """finetune (`icl_eval/methods/finetune.py`): train every weight, or LoRA adapters (the `peft` extra)."""
    t5_cross: Literal["none", "aligned"] = "none"
    """saicl on T5 (icl_eval/models/t5.py): no position bias between a demonstration and the test (Appendix B),
    or the stock bias with each demonstration right before the test (then k = 1 equals concat)."""

    def __post_init__(self) -> None:
        if self.n_groups is not None and not 1 <= self.n_groups <= MAX_GROUPS:  # groups are made as lists up front
            raise ConfigError(f"n_groups = {self.n_groups}: give from 1 to {MAX_GROUPS:,} groups (at most one per "
                              "demonstration)")
        if self.group_tokens is not None and self.group_tokens < 1:
            raise ConfigError(f"group_tokens = {self.group_tokens}: give a budget of at least 1 token")
        if self.scoring not in RULES:
            raise ConfigError(f"scoring {self.scoring!r} is not known; valid: {sorted(RULES)}")
        if self.rescale not in ("log_m", "off"):
            try:
                float(self.rescale)
            except ValueError:
                raise ConfigError(f"rescale={self.rescale!r}: use log_m, off, or a number") from None


@dataclass
class MethodResult:
    scores: list[list[float]]
    """(items, candidates)."""
    info: dict[str, Any] = field(default_factory=dict)
    """What was actually used: demonstrations per item, groups, tokens, cache bytes, seconds."""


Progress = Callable[[int], None] | None


Method = Callable[..., MethodResult]


def reduce_scores(per_group: np.ndarray, reduce: str) -> np.ndarray:
    """(G, C) per-group scores -> (C,): their mean (`mean_score`), or the log of the mean probability."""
    if reduce == "mean_score":
        return per_group.mean(axis=0)
    logp = per_group - np.logaddexp.reduce(per_group, axis=1, keepdims=True)
    return np.log(np.exp(logp).mean(axis=0))
