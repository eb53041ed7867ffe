"""Exact match of a greedy generation: the answer read from the text exactly as it is scored.

A generation is read up to its first line break (after any leading whitespace), then:
- `number` (passkey, a needle's value, an MQAR value): the first run of digits; correct when it is
  the gold number;
- `numbers` (niah_multivalue, niah_multiquery): every run of digits; correct when they are exactly
  the gold set (order free, as RULER lists them unordered; a missing or an extra number is wrong);
- `names` (variable_tracking): every 5-capital-letter word; correct when they are exactly the gold set;
- `uuid` (kv_recall): the first UUID; correct when it is the gold one.
"""

from __future__ import annotations

import re

PATTERNS = {"number": r"\d+", "numbers": r"\d+", "names": r"\b[A-Z]{5}\b",
            "uuid": r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"}
SETS = {"numbers", "names"}
"""Kinds whose answer is every match (a set); the others take the first match."""


def first_line(text: str) -> str:
    return text.lstrip().split("\n", 1)[0]


def extract(kind: str, text: str) -> tuple[str, ...]:
    """The answer(s) a generation gives, as scored: one match, or every match for a set kind."""
    found = re.findall(PATTERNS[kind], first_line(text))
    return tuple(found) if kind in SETS else tuple(found[:1])


def correct(kind: str, text: str, gold: tuple[str, ...]) -> bool:
    got = extract(kind, text)
    if kind in SETS:
        return len(got) == len(set(got)) and set(got) == set(gold)
    return got == tuple(gold)


def ends_answer(text: str) -> bool:
    """Generation may stop: a line break after the answer began."""
    return "\n" in text.lstrip()
