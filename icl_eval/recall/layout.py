"""One item's prompts at every depth, token-exact in the model's own tokens.

A prompt is: bos, the instruction, the body (haystack units with the needles between them), the
question(s). Its length is the `--lengths` value minus the slack: the body takes whole haystack
units while the longest prompt fits, so `tokens` (recorded) is the length read and `slack` < one unit.

Placement, in the model's tokens, the same for every depth of an item:
1. `others` (distractors, the other chains) go to seeded unit boundaries, in their order; this is
   the body without the group, of B tokens;
2. the group's first needle goes to the boundary nearest depth/100 x B (the earlier one on a tie),
   the group's i-th of n to the boundary nearest (depth + i x (100 - depth) / n)/100 x B.
So at depth 0 the needle opens the body, at 100 it closes it, and `depth_actual` (recorded) is
100 x (tokens of the body before it) / B. Every depth of an item shares the body up to its needle:
the prompts of one item share their prefixes, which `icl_eval.recall.encoding` encodes once.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass

from evalm.icl_eval.recall.families import Spec

Tokens = tuple[int, ...]


@dataclass(frozen=True)
class Encoded:
    """A Spec's texts in the model's tokens (each piece encoded on its own)."""

    head: Tokens  # bos + instruction
    group: tuple[Tokens, ...]
    others: tuple[Tokens, ...]
    questions: tuple[Tokens, ...]
    answers: tuple[Tokens, ...]

    @property
    def fixed(self) -> int:
        """Tokens of the longest prompt apart from the haystack: head, needles, the question chain."""
        chain = sum(map(len, self.questions)) + sum(map(len, self.answers[:-1]))
        return len(self.head) + sum(map(len, self.group)) + sum(map(len, self.others)) + chain


def encode_spec(spec: Spec, tokenizer, bos: Tokens) -> Encoded:
    enc = tokenizer.encode
    return Encoded(tuple(bos) + tuple(enc(spec.instruction)), tuple(tuple(enc(t)) for t in spec.group),
                   tuple(tuple(enc(t)) for t in spec.others), tuple(tuple(enc(q)) for q in spec.questions),
                   tuple(tuple(enc(a)) for a in spec.answer_texts))


@dataclass(frozen=True)
class Placed:
    """One depth of an item: a prompt per question, where the needle went, what was cut."""

    depth: int
    prompts: tuple[Tokens, ...]
    needle_at: int
    """Token index of the group's first needle in the prompts."""
    depth_actual: float
    dropped: int = 0
    """Tokens cut from the left after the bos (overflow = drop_left)."""
    needle_lost: bool = False
    """The cut took (part of) the first needle."""


def body_pieces(units: list[Tokens], others: tuple[Tokens, ...], rng: random.Random) -> list[Tokens]:
    """The haystack units with `others` at seeded boundaries (sorted, so their order is kept)."""
    at = sorted(rng.randint(0, len(units)) for _ in others)
    pieces: list[Tokens] = []
    for i, unit in enumerate(units + [()]):
        pieces += [o for o, j in zip(others, at) if j == i]
        pieces += [unit] if unit else []
    return pieces


def place(enc: Encoded, pieces: list[Tokens], depth: int) -> Placed:
    """The prompts with the group at `depth` (module docstring), before any window cut."""
    bounds = [0]
    for p in pieces:
        bounds.append(bounds[-1] + len(p))
    total, n = bounds[-1], len(enc.group)
    slots = [_nearest(bounds, (depth + i * (100 - depth) / n) / 100 * total) for i in range(n)]
    body: list[int] = []
    for b, piece in enumerate(pieces + [()]):
        for needle, slot in zip(enc.group, slots):
            body += needle if slot == b else ()
        body += piece
    context = enc.head + tuple(body)
    prompts, chain = [], ()
    for question, answer in zip(enc.questions, enc.answers):
        prompts.append(context + chain + question)
        chain += question + answer  # the next query continues after this gold answer (mqar)
    first = bounds[slots[0]]
    return Placed(depth, tuple(prompts), len(enc.head) + first, 100.0 * first / total if total else 0.0)


def _nearest(bounds: list[int], target: float) -> int:
    """Index of the boundary nearest `target` tokens (the earlier on a tie)."""
    i = bisect.bisect_left(bounds, target)
    if i == len(bounds) or (i > 0 and target - bounds[i - 1] <= bounds[i] - target):
        return i - 1
    return i


def cut_left(placed: Placed, bos: Tokens, room: int) -> Placed:
    """drop_left: each prompt keeps its bos and loses as many tokens after it as the longest must to fit
    `room` (the same cut for every question of the item, so they still share their context)."""
    cut = max(len(p) for p in placed.prompts) - room
    if cut <= 0:
        return placed
    prompts = tuple(tuple(bos) + p[len(bos) + cut :] for p in placed.prompts)
    return Placed(placed.depth, prompts, placed.needle_at - cut, placed.depth_actual, cut,
                  placed.needle_at < len(bos) + cut)
