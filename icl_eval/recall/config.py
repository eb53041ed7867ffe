"""`[recall]`: the settings of `evalm eval recall` (docs/evaluation.md, "Recall").

Built with `config_toolkit.build`, so an unknown key names the file, the section and the valid keys;
a depth outside 0-100, an unknown family or a repeated value is one error before any work.
"""

from __future__ import annotations

from typing import Literal

from pydantic.dataclasses import dataclass

from evalm.config_toolkit import ConfigError, FROZEN
from evalm.icl_eval.config import WindowedRunOptions

FAMILIES = ("passkey", "niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "variable_tracking",
            "kv_recall", "mqar")
"""The generated families (icl_eval/recall/families.py), in the order results list them."""


@dataclass(config=FROZEN, frozen=True)
class RecallConfig(WindowedRunOptions):
    """Recall grid: families x lengths x depths x seeds, items per seed (docs/evaluation.md, "Recall")."""

    tasks: tuple[str, ...] = FAMILIES
    """Families to run, from FAMILIES."""
    lengths: tuple[int, ...] = (1024, 4096)
    """Prompt lengths in the model's own tokens (everything read before the first answer token), up to
    262,144; a prompt is whole haystack units up to the length, the rest recorded as slack."""
    depths: tuple[int, ...] = (0, 25, 50, 75, 100)
    """Needle position: percent of the haystack before the (first) needle, 0-100."""
    seeds: tuple[int, ...] = (1, 2, 3)
    """One set of items per seed; intervals bootstrap seeds, then items within each seed."""
    items: int = 5
    """Items per seed, task and length; every item is scored at every depth."""
    haystack: Literal["words", "filler", "books", "noise"] = "words"
    """What the needles of niah_*, variable_tracking, kv_recall and mqar hide in: `words` (seeded random
    words, the asked key's own words left out), `filler` (the repeated sentences of passkey retrieval, which
    RULER calls its noise) or `books` (sentences of `books`). passkey always uses `filler` (Mohtashami &
    Jaggi 2023). `noise`, the name of `words` until 28 Nov 2026, is refused: it meant the opposite of RULER's."""
    books: tuple[str, ...] = ()
    """Book sources for haystack = books, read as `evalm eval ppl --books` reads them."""
    niah_keys: int = 4
    """niah_multikey: needles with different keys, one of them asked (RULER's multikey_1: 4)."""
    niah_values: int = 4
    """niah_multivalue: values of the one key asked, all to be given (RULER: 4)."""
    niah_queries: int = 4
    """niah_multiquery: keys asked in one question, all values to be given (RULER: 4)."""
    vt_hops: int = 2
    """variable_tracking: assignments after the first in the chain asked (1 or 2)."""
    vt_chains: int = 2
    """variable_tracking: chains in the context, one asked (the others are distractors)."""
    kv_pairs: int = 10
    """kv_recall: pairs of the JSON object (HELMET's JSON KV), 10-100."""
    mqar_pairs: int = 16
    """mqar: key-value pairs, every key then asked in turn (Zoology's MQAR), at most 90."""
    bos: str = "auto"
    """What each prompt starts with: auto (the model's own), none, eos, or one token (as `evalm eval icl --bos`)."""
    overflow: Literal["error", "drop_left"] = "error"
    """A prompt (plus its answer tokens) past the model's window: refused before any work, or its haystack
    cut from the left keeping the bos (`evalm eval icl`'s `on_overflow`); `tokens` records what was read."""
    segment_tokens: int = 4096
    """Tokens per forward when a prompt is encoded into the cache."""
    save_predictions: bool = False
    """Write predictions.jsonl: every prompt's generation, extracted answer and gold."""

    def __post_init__(self) -> None:
        for name in ("tasks", "lengths", "depths", "seeds"):
            values = getattr(self, name)
            if not values or len(set(values)) < len(values):
                raise ConfigError(f"{name} {list(values)}: give at least one value and none twice")
        unknown = [t for t in self.tasks if t not in FAMILIES]
        if unknown:
            raise ConfigError(f"tasks: unknown famil{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                              f"valid: {', '.join(FAMILIES)}")
        if any(d < 0 or d > 100 for d in self.depths):
            raise ConfigError(f"depths {list(self.depths)}: a depth is the percent of the haystack before the needle; "
                              "give values from 0 to 100")
        if any(n < 1 or n > 262_144 for n in self.lengths):
            raise ConfigError(f"lengths {list(self.lengths)}: give prompt lengths from 1 to 262,144 tokens")
        if self.haystack == "noise":
            raise ConfigError("haystack = 'noise': renamed 'words' (random words, the asked key's own left out), "
                              "since RULER's noise haystack is this project's 'filler'; give 'words' or 'filler'")
        _at_least("items", self.items, 1)
        if self.items > MAX_ITEMS:  # each item is a whole prompt of up to 262,144 tokens
            raise ConfigError(f"items = {self.items}: give at most {MAX_ITEMS:,} items per length, depth and seed "
                              "(RULER scores 500)")
        for name, low, high in (("niah_keys", 2, 100), ("niah_values", 2, 100), ("niah_queries", 2, 100),
                                ("vt_hops", 1, 2), ("vt_chains", 1, 10), ("kv_pairs", 10, 100), ("mqar_pairs", 1, 90)):
            value = getattr(self, name)
            if not low <= value <= high:
                raise ConfigError(f"{name} = {value}: give a value from {low} to {high}")
        _at_least("segment_tokens", self.segment_tokens, 1)
        super().__post_init__()  # context_window


MAX_ITEMS = 10_000
"""Items per cell at most: `--items 1e8` drew and held a hundred million prompts before the first score."""


def _at_least(name: str, value: int, low: int) -> None:
    if value < low:
        raise ConfigError(f"{name} = {value}: give a value of at least {low}")
