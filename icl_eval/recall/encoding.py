"""Prompts that share a prefix encoded once through the cache, then a greedy answer after each.

The prompts of one item (every depth, every question) form a trie: every depth's prompt is the same
body up to its needle, and mqar's queries each extend the previous one. The walk encodes the
longest prefix all prompts of a branch share into one cache, forks the cache (`CausalLM.fork`, copy
on write) for every branch but the last, which continues in the parent's own cache, and decodes
greedily where a prompt ends (`icl_eval.models.decoding.decode_from`). Each token of the trie is
encoded once: `Cost.encoded` against `Cost.prompted` (every prompt encoded on its own) is the saving,
and at most two caches of one item's length are alive at a time.

A cache continued after a fork equals one encoded from scratch (EVALM: tests/evalm; Hugging Face:
`past_key_values`), so the answers are those of encoding each prompt alone (checked by
tests/icl_eval/test_recall_runs.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from evalm.icl_eval.models.decoding import GenerationSettings, decode_from

Tokens = tuple[int, ...]


@dataclass
class Cost:
    """Tokens run through the model for one item: prompts (shared prefixes once), generation."""

    encoded: int = 0
    prompted: int = 0
    """Sum of the prompts' lengths: what encoding every prompt alone would run."""
    generated: int = 0


def answer_all(lm, prompts: Sequence[Tokens], budgets: Sequence[int], segment_tokens: int,
               stop: Callable[[list[int]], bool]) -> tuple[list[list[int]], Cost]:
    """The greedy generation after each prompt (at most budgets[i] tokens, up to eos or `stop`)."""
    outputs: list[list[int]] = [[] for _ in prompts]
    cost = Cost(prompted=sum(map(len, prompts)))
    walk = _Walk(lm, prompts, [np.asarray(p, dtype=np.int64) for p in prompts], budgets, segment_tokens, stop,
                 outputs, cost)
    walk.branch(lm.new_state(0), None, 0, list(range(len(prompts))))
    return outputs, cost


@dataclass
class _Walk:
    lm: object
    prompts: Sequence[Tokens]
    arrays: list[np.ndarray]
    budgets: Sequence[int]
    segment_tokens: int
    stop: Callable[[list[int]], bool]
    outputs: list[list[int]]
    cost: Cost

    def branch(self, state, logits, pos: int, members: list[int]) -> None:
        """Answer `members`, whose prompts share their first `pos` tokens, all in `state` (this branch's own)."""
        while members:
            common = _common_prefix([self.arrays[i] for i in members], pos)
            logits = self.extend(state, self.prompts[members[0]][pos:common], logits)
            pos = common
            rest = [i for i in members if len(self.prompts[i]) > pos]
            for i in members:
                if len(self.prompts[i]) == pos:  # ends here: decode in a fork unless nothing else needs the cache
                    own = state if len(members) == 1 else self.lm.fork(state)
                    self.outputs[i] = decode_from(self.lm, own, logits, GenerationSettings(self.budgets[i]), self.stop)
                    self.cost.generated += len(self.outputs[i])
            branches: dict[int, list[int]] = {}
            for i in rest:  # by the next token, in the prompts' order
                branches.setdefault(self.prompts[i][pos], []).append(i)
            *forked, members = list(branches.values()) or [[]]
            for group in forked:
                self.branch(self.lm.fork(state), logits, pos, group)

    def extend(self, state, tokens: Tokens, logits):
        """Encode `tokens` after the cache in segments; the last position's logits (1, 1, V)."""
        for i in range(0, len(tokens), self.segment_tokens):
            segment = torch.tensor([list(tokens[i : i + self.segment_tokens])], dtype=torch.long)
            logits = self.lm.extend(state, segment)[:, -1:]
            self.cost.encoded += segment.shape[1]
        return logits


def _common_prefix(rows: list[np.ndarray], start: int) -> int:
    """Length of the prefix every row shares (every row shares the first `start`)."""
    end = min(len(r) for r in rows)
    for row in rows[1:]:
        differ = np.flatnonzero(rows[0][start:end] != row[start:end])
        end = start + int(differ[0]) if differ.size else end
    return end
