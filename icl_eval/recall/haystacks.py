"""The haystacks needles hide in, as units of the model's own tokens: filler, random words, book sentences.

A haystack is a run of units, each encoded on its own: a sentence of the filler, a random word, a
sentence of a book. Needles go between units (never inside a word), and a prompt's length is a sum
of known unit lengths: whole units are taken while they fit the budget, and what is left (less than
the next unit) is the item's slack, recorded with it.

- `filler`: Mohtashami & Jaggi's passkey filler, "The grass is green. The sky is blue. The sun is
  yellow. Here we go. There and back again." repeated (RULER calls the same text its "noise"
  haystack);
- `words`: seeded random words (icl_eval.recall.vocabulary), a new draw per item: text with no
  repetition to compress, the word-level form of Zoology's random non-query tokens. The asked key's
  own words are left out (`Spec.asked_words`): the keys are drawn from the same words, and a haystack
  that repeats the asked key's adjective and noun hides the needle among partial copies of it. Named
  `noise` until 28 Nov 2026 (and the asked key's words were drawn then); RULER's "noise" is `filler`;
- `books`: consecutive sentences of the books (read as `evalm eval ppl --books` reads them), from a
  seeded starting sentence per item, whitespace normalised.
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Iterator, Sequence

from evalm.config_toolkit import InputError
from evalm.icl_eval.recall.vocabulary import NOISE_WORDS

FILLER = (" The grass is green.", " The sky is blue.", " The sun is yellow.", " Here we go.", " There and back again.")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


class Haystacks:
    """Unit streams in one tokenizer's tokens (each unit encoded once and kept)."""

    def __init__(self, tokenizer, books: Sequence[str] = (), book_tokens: int = 0):
        """`book_tokens`: the longest haystack any item needs from the books (0: no books read)."""
        self.filler = [tuple(tokenizer.encode(s)) for s in FILLER]
        self.words = [tuple(tokenizer.encode(" " + w)) for w in NOISE_WORDS]
        self.book_units, self.book_starts = _book_units(tokenizer, books, book_tokens) if book_tokens else ([], 0)

    def stream(self, kind: str, rng: random.Random, avoid: Sequence[str] = ()) -> Iterator[tuple[int, ...]]:
        """The units of one item's haystack, in order (endless; the caller takes what fits); `avoid`: words
        a `words` haystack leaves out."""
        if kind == "filler":
            return itertools.cycle(self.filler)
        if kind == "words":
            drawn = [unit for word, unit in zip(NOISE_WORDS, self.words) if word not in avoid] if avoid else self.words
            return (rng.choice(drawn) for _ in itertools.count())
        start = rng.randrange(self.book_starts)  # every start leaves enough text for the longest prompt
        return iter(self.book_units[start:])

    def take(self, kind: str, rng: random.Random, budget: int, avoid: Sequence[str] = ()) -> tuple[list[tuple[int, ...]], int]:
        """Whole units while they fit `budget` tokens, and the slack (budget minus their tokens)."""
        units, used = [], 0
        for unit in self.stream(kind, rng, avoid):
            if used + len(unit) > budget:
                break
            units.append(unit)
            used += len(unit)
        return units, budget - used


def _book_units(tokenizer, books: Sequence[str], need: int) -> tuple[list[tuple[int, ...]], int]:
    """Book sentences as units, read until twice `need` tokens (starts vary) or the books end, and how
    many starting sentences leave at least `need` tokens; too little text is one error."""
    from evalm.icl_eval.perplexity.books import iter_books

    if not books:
        raise InputError("haystack = books needs --books SOURCE (a folder of .txt books, a jsonl file with `text`, "
                         "or a cached dataset id such as deepmind/pg19:test)")
    units, total = [], 0
    for _, text in iter_books(books):
        for sentence in SENTENCE_END.split(" ".join(text.split())):
            if sentence:
                units.append(tuple(tokenizer.encode(" " + sentence)))
                total += len(units[-1])
        if total >= 2 * need:
            break
    suffix, starts = total, 0
    for unit in units:
        if suffix < need:
            break
        starts, suffix = starts + 1, suffix - len(unit)
    if starts == 0:
        raise InputError(f"--books {' '.join(map(str, books))}: {total:,} tokens of text, but the longest prompt needs "
                         f"{need:,} tokens of haystack; give more books or lower --lengths")
    return units, starts
