"""The token-budget protocol: per cell, as many demonstrations as fit a prompt of B tokens.

HELMET (4k ... 128k) and ManyICLBench (1k ... 128k) fix the context length, not the shot count.
For a budget B, the draw seed orders the training pool once (`selection.dataset_level` over the
whole pool, label-balanced with `balanced`), and the cell takes the longest prefix of that order
whose prompt fits: the context `[bos] (instruction) d_1 sep ... sep d_k` plus the longest test
sequence among the items scored (`sep I(x, y)` for its longest candidate), counted in the model's
own tokens. So B picks exactly the largest fitting count; the count and the tokens used are
recorded per seed. B = 0 is the no-demonstration reference (0 shots), so `vs_0_shots` pairs every
budget with it. A B that fits no demonstration is an error, never a silent 0. A budget past the
model's window is not cut here: the method's own overflow rule applies (`on_overflow`: raise, or
drop whole demonstrations from the left and record how many were used).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from evalm.config_toolkit import UserError
from evalm.icl_eval.tasks.prompts import Demo, PromptBuilder


class BudgetTooSmall(UserError, ValueError):
    """A budget below one demonstration plus the test item."""


def fit(prompt: PromptBuilder, order: Sequence[int], demo: Callable[[int], Demo], test_tokens: int,
        budget: int) -> tuple[int, int]:
    """(k, prompt tokens): the largest prefix of `order` whose context plus `test_tokens` fits `budget`.

    `demo(i)` renders training item i (called lazily, so a large pool is not tokenized whole);
    `test_tokens` is the longest test sequence after a non-empty context (lead = sep)."""
    if budget == 0:
        return 0, 0
    head = len(prompt.bos) + len(prompt.instruction)
    used, k = head + test_tokens, 0
    for i in order:
        step = len(demo(i).tokens) + (len(prompt.sep) if k else 0)
        if used + step > budget:
            break
        used, k = used + step, k + 1
    if k == 0:
        first = head + test_tokens + (len(demo(order[0]).tokens) if order else 0)
        raise BudgetTooSmall(f"--budgets {budget}: below one demonstration (the first demonstration with the longest "
                             f"test item takes {first} tokens); raise the budget to at least {first} or use 0 for "
                             "the no-demonstration reference")
    return k, used
