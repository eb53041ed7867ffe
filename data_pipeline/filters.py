"""The six quality filters of EVALM Appendix A.1 / BLOOM, as pure functions (docs/data_pipeline.md).

Each ratio is a pure function of the (normalised) text. One table, FILTERS, declares the filters
(reason, measure, FilterProfile bound); the reasons, the ratios record and the checks are derived
from it. `reject_reason` applies them in the table's order and returns the first failing
filter's name, or None to keep. Every ratio is
computed for every document so the runner can histogram them: thresholds are to be chosen by
looking at data (docs/data_pipeline.md, "measure drop rates per subset").
"""

from __future__ import annotations

import math
import string
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, make_dataclass
from functools import cache, cached_property

from evalm.data_pipeline.config import FilterProfile

# docs/data_pipeline.md: after ASCII normalisation the special characters are punctuation, digits
# and whitespace (BLOOM's `special_characters_default` restricted to ASCII).
SPECIAL = frozenset(string.punctuation + string.digits + string.whitespace)
_STRIP = string.punctuation + string.digits + string.whitespace

def words(text: str) -> list[str]:
    """Split on space/newline/tab and drop empties (normalised text has no other whitespace)."""
    return text.split()


def normalize_word(word: str) -> str:
    """Lower-case, strip special characters at both ends (BLOOM `get_words_from_document`)."""
    return word.lower().strip(_STRIP)


def normalized_words(text: str) -> list[str]:
    return [w for w in map(normalize_word, words(text)) if w]


def char_repetition_ratio(text: str, n: int = 10) -> float:
    """Share of the k most frequent character n-grams among all n-grams, k = min(floor(sqrt(d)),
    d - n-grams seen once), d = distinct n-grams (BLOOM `compute_char_repetition_ratio`)."""
    counts = Counter(text[i : i + n] for i in range(len(text) - n + 1))
    if not counts:
        return 0.0
    freqs = sorted(counts.values(), reverse=True)
    once = sum(1 for f in freqs if f == 1)
    k = min(math.isqrt(len(freqs)), len(freqs) - once)
    return sum(freqs[:k]) / sum(freqs)


def word_repetition_ratio(norm_words: list[str], n: int = 5) -> float:
    """Occurrences of word n-grams seen more than once / all n-grams (BLOOM
    `compute_word_repetition_ratio`)."""
    grams = Counter(tuple(norm_words[i : i + n]) for i in range(len(norm_words) - n + 1))
    total = sum(grams.values())
    if total == 0:
        return 0.0
    return sum(c for c in grams.values() if c > 1) / total


def special_ratio(text: str) -> float:
    """Fraction of characters that are ASCII punctuation, digits or whitespace."""
    if not text:
        return 0.0
    return sum(1 for ch in text if ch in SPECIAL) / len(text)


def word_list_ratio(norm_words: list[str], vocabulary: frozenset[str]) -> float:
    """Fraction of normalised words found in a list, capped at 1 (stop words, flagged words)."""
    if not norm_words:
        return 0.0
    return min(1.0, sum(1 for w in norm_words if w in vocabulary) / len(norm_words))


class Text:
    """What the measures read from one normalised document; words are split once, on first use
    (the word-based filters share them)."""

    def __init__(self, text: str, stopwords: frozenset[str], flagged: frozenset[str], char_n: int, word_n: int):
        self.text, self.stopwords, self.flagged, self.char_n, self.word_n = text, stopwords, flagged, char_n, word_n

    @cached_property
    def words(self) -> list[str]:
        return words(self.text)

    @cached_property
    def norm_words(self) -> list[str]:
        return normalized_words(self.text)


@dataclass(frozen=True)
class Filter:
    """One quality filter: the ratio it measures and the FilterProfile field(s) that bound it.

    A document fails when its value is below `profile.<low>` or above `profile.<high>` (a filter
    names one bound or both); the bounds are thresholds in data_pipeline.config.FilterProfile."""

    reason: str
    """Recorded as `filter_reason` when this is the first filter a document fails."""
    measure: Callable[[Text], float]
    """The document's value (a ratio or a count), from its normalised text."""
    low: str = ""
    """The FilterProfile field the value must reach (>=); "" for no lower bound."""
    high: str = ""
    """The FilterProfile field the value must not exceed (<=); "" for no upper bound."""
    kind: type = float
    """The value's type in the ratios record (word counts are int)."""

    def passes(self, value: float, profile: FilterProfile) -> bool:
        return (not self.low or value >= getattr(profile, self.low)) and (
            not self.high or value <= getattr(profile, self.high))


# The order of the quality-filter table of docs/data_pipeline.md: the first failure is the recorded reason. A new filter is
# one entry here plus its threshold field(s) in FilterProfile.
FILTERS: tuple[Filter, ...] = (
    Filter("word_count", lambda t: len(t.words), low="min_words", high="max_words", kind=int),
    Filter("char_repetition", lambda t: char_repetition_ratio(t.text, t.char_n), high="max_char_repetition"),
    Filter("word_repetition", lambda t: word_repetition_ratio(t.norm_words, t.word_n), high="max_word_repetition"),
    Filter("special_characters", lambda t: special_ratio(t.text), high="max_special_ratio"),
    Filter("stop_words", lambda t: word_list_ratio(t.norm_words, t.stopwords), low="min_stopword_ratio"),
    Filter("flagged_words", lambda t: word_list_ratio(t.norm_words, t.flagged), high="max_flagged_ratio"),
)


@cache
def ratios_record(table: tuple[Filter, ...]) -> type:
    """The frozen record of one value per filter of a table, in table order (`asdict` gives the
    `filter_ratios` written with each rejected document)."""
    record = make_dataclass("Ratios", [(f.reason, f.kind) for f in table], frozen=True, slots=True)
    record.__module__ = __name__  # the default table's record pickles as filters.Ratios
    return record


REASONS = tuple(f.reason for f in FILTERS)
Ratios = ratios_record(FILTERS)


def ratios(text: str, stopwords: frozenset[str], flagged: frozenset[str], char_n: int = 10, word_n: int = 5,
           table: tuple[Filter, ...] = FILTERS):
    """Every filter's value for one document (all are computed, for the histograms in stats/)."""
    t = Text(text, stopwords, flagged, char_n, word_n)
    return ratios_record(table)(**{f.reason: f.measure(t) for f in table})


def reject_reason(r, p: FilterProfile, table: tuple[Filter, ...] = FILTERS) -> str | None:
    """The first failing filter's name, or None when the document is kept."""
    for f in table:
        if not f.passes(getattr(r, f.reason), p):
            return f.reason
    return None
