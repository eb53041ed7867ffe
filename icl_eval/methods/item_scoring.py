"""A test item's candidates scored after a context cache: the shared test prefix once, then the answers.

The candidates of an item are `lead I(x, y)` for each label y; they share `lead` and the part of
I(x) before the label slot (the template's text, the test input). The old way fed every candidate
whole after the cache (`reencode`: with K labels the test input is encoded K times). `shared`
encodes the longest common prefix once on a fork of the context cache, forks that again per
candidate and feeds only the rest of each candidate, minus its last token (which predicts
nothing). When every candidate differs only in its last token (single-token labels at the end of
the template) the prefix's one forward scores all of them. Both give the same numbers: attention
over a cache is exact for any split of the sequence (`methods.encode`), and
`scoring.score_after_prefix` reads the same rows as `scoring.score_candidates`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from evalm.icl_eval.models.lm import CausalLM, right_pad
from evalm.icl_eval.tasks.prompts import Candidate, TestItem
from evalm.icl_eval.methods.scoring import score_after_prefix, score_candidates


def shared_prefix_length(candidates: Sequence[Candidate]) -> int:
    """Tokens every candidate starts with, leaving each at least its last token."""
    first = candidates[0].tokens
    limit = min(len(c.tokens) for c in candidates) - 1
    n = 0
    while n < limit and all(c.tokens[n] == first[n] for c in candidates):
        n += 1
    return n


def score_reencoding(lm: CausalLM, state, item: TestItem, rule: str) -> list[float]:
    """Every candidate fed whole after the cache (one right-padded batch): the reference."""
    rows = [c.tokens for c in item.candidates]
    kids = lm.fork(state, batch_size=len(rows))
    logits = lm.extend(kids, right_pad(rows, lm.tokenizer.eos_id))
    return score_candidates(logits, item.candidates, rule)


def score_shared(lm: CausalLM, state, item: TestItem, rule: str) -> list[float]:
    """The shared prefix encoded once on a fork of `state`, each candidate's remaining tokens on a fork of that."""
    cands = item.candidates
    p = shared_prefix_length(cands)
    node = lm.fork(state)
    if p:
        prefix_logits = lm.extend(node, torch.tensor([cands[0].tokens[:p]], dtype=torch.long))[0]
    else:
        prefix_logits = None
    tails = [c.tokens[p : len(c.tokens) - 1] for c in cands]
    tail_logits = None
    if any(tails):
        kids = lm.fork(node, batch_size=len(cands))
        tail_logits = lm.extend(kids, right_pad([t or (lm.tokenizer.eos_id,) for t in tails], lm.tokenizer.eos_id))
    if prefix_logits is None:  # nothing shared (an empty lead before a label-first template)
        prefix_logits = torch.zeros((0, 1)) if tail_logits is None else tail_logits.new_zeros((0, tail_logits.shape[-1]))
    return score_after_prefix(prefix_logits, tail_logits, cands, rule)


SCORERS = {"shared": score_shared, "reencode": score_reencoding}
"""How a method scores an item after its context cache (`MethodOptions.test_prefix`)."""
