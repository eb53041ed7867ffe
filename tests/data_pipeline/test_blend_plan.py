"""Blend plans against hand-computed budgets.

    python -m pytest tests/data_pipeline/test_blend_plan.py -q
"""

from __future__ import annotations

import pytest

from evalm.data_pipeline.blend import plan, targets
from evalm.data_pipeline.config import Budgets


def test_relative_budgets_ignore_subsets_absent_from_the_data():
    # Table-5-like shares 1 : 3 : 6 with the third subset missing: the other two keep 1 : 3 and the
    # largest such blend without repeating is limited by A (100 tokens) -> A 100, B 300.
    budgets = Budgets(tokens={"A": 1.0, "B": 3.0, "C": 6.0}, relative=True, overflow="cap")
    got = targets(budgets, {"A": 100, "B": 1000})
    assert got == pytest.approx({"A": 100.0, "B": 300.0, "C": 0.0})
    p = plan(["A"] * 10 + ["B"] * 100, [10] * 110, budgets, seed=0)
    assert p.report["A"]["actual_tokens"] == 100 and 300 <= p.report["B"]["actual_tokens"] <= 310
    assert p.report["C"]["available_tokens"] == 0 and p.report["C"]["actual_tokens"] == 0


def test_budgets_that_select_nothing_are_an_error_not_an_empty_blend():
    budgets = Budgets(tokens={"Wikipedia (en)": 1.0}, relative=False, scale=0.0)
    with pytest.raises(ValueError, match="select no document"):
        plan(["Wikipedia (en)"] * 3, [5, 5, 5], budgets, seed=0)
