"""The six quality filters of EVALM Appendix A.1 / BLOOM, as pure functions (DATA_SPEC.md §3).

Each ratio is a pure function of the (normalised) text; `reject_reason` applies them in the
table's order and returns the first failing filter's name, or None to keep. Every ratio is
computed for every document so the runner can histogram them: thresholds are to be chosen by
looking at data (DATA_SPEC.md §3, "measure drop rates per subset").
"""

from __future__ import annotations

import math
import string
from collections import Counter
from dataclasses import dataclass

from data_pipeline.config import FilterProfile

# DATA_SPEC.md §3: after ASCII normalisation the special characters are punctuation, digits
# and whitespace (BLOOM's `special_characters_default` restricted to ASCII).
SPECIAL = frozenset(string.punctuation + string.digits + string.whitespace)
_STRIP = string.punctuation + string.digits + string.whitespace

# The order of DATA_SPEC.md §3's table: the first failure is the recorded reason.
REASONS = ("word_count", "char_repetition", "word_repetition", "special_characters", "stop_words", "flagged_words")


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


@dataclass(frozen=True, slots=True)
class Ratios:
    word_count: int
    char_repetition: float
    word_repetition: float
    special_characters: float
    stop_words: float
    flagged_words: float


def ratios(text: str, stopwords: frozenset[str], flagged: frozenset[str], char_n: int = 10, word_n: int = 5) -> Ratios:
    norm = normalized_words(text)
    return Ratios(
        word_count=len(words(text)),
        char_repetition=char_repetition_ratio(text, char_n),
        word_repetition=word_repetition_ratio(norm, word_n),
        special_characters=special_ratio(text),
        stop_words=word_list_ratio(norm, stopwords),
        flagged_words=word_list_ratio(norm, flagged),
    )


def reject_reason(r: Ratios, p: FilterProfile) -> str | None:
    """The first failing filter's name, or None when the document is kept."""
    checks = (
        p.min_words <= r.word_count <= p.max_words,
        r.char_repetition <= p.max_char_repetition,
        r.word_repetition <= p.max_word_repetition,
        r.special_characters <= p.max_special_ratio,
        r.stop_words >= p.min_stopword_ratio,
        r.flagged_words <= p.max_flagged_ratio,
    )
    for reason, ok in zip(REASONS, checks):
        if not ok:
            return reason
    return None
