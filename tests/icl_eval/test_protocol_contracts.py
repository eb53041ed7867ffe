"""The protocol's contracts, declared rather than implied, each against an independent computation:
- whether seeds share the test items is a field of the data source (a crossed or nested bootstrap),
  not the identity of a Python object (copying the splits used to change every interval);
- under Top-k each item is calibrated against content-free inputs after its own demonstrations
  (not item 0's);
- every timing of a Top-k cell covers all its items (not the first item's)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from evalm.icl_eval.config import EvalConfig
from evalm.icl_eval.methods.decoder import METHODS, MethodOptions
from evalm.icl_eval.protocol.runner import Runner
from evalm.icl_eval.methods.scoring import calibrate
from evalm.icl_eval.protocol.selection import TopK
from evalm.icl_eval.tasks.data import SeedSplits
from evalm.icl_eval.tasks.task import Task
from tests.icl_eval.conftest import tiny_evalm

pytestmark = pytest.mark.usefixtures("one_thread")

TASK = Task("toy", "{text}={label}", ("a", "b"))
TRAIN = [{"text": t, "label": y} for t, y in [("red apple", 0), ("green apple", 0), ("red car", 1), ("blue car", 1),
                                              ("ripe apple", 0), ("fast car", 1), ("old apple", 0), ("new car", 1)]]
TEST = [{"text": "sour apple", "label": 0}, {"text": "slow car", "label": 1}, {"text": "apple pie", "label": 0}]
SPLITS = {"train": TRAIN, "test": TEST}


def _runner(splits: SeedSplits, **fields) -> Runner:
    config = EvalConfig(task="toy", methods=("concat",), **{"shots": (2,), "seeds": (1, 2), **fields})
    return Runner(tiny_evalm("full"), TASK, config, MethodOptions(), splits)


def test_copied_splits_stay_one_crossed_design():
    """Each seed gets its own copy of the same data: the items are shared all the same."""
    runner = _runner(SeedSplits(lambda seed: copy.deepcopy(SPLITS), shares_test=True))
    records = runner.run()
    assert {r["item_set"] for r in records} == {0}
    assert {b["item_set"] for b in runner.baselines} == {0}
    nested = _runner(SeedSplits(lambda seed: SPLITS, shares_test=False)).run()
    assert {r["seed"]: r["item_set"] for r in nested} == {1: 0, 2: 2}


def test_a_runner_without_the_declaration_is_refused():
    with pytest.raises(TypeError, match="declare whether seeds share the test items"):
        Runner(tiny_evalm("full"), TASK, EvalConfig(task="toy"), MethodOptions(), lambda seed: SPLITS)


def test_topk_calibration_uses_each_items_own_demonstrations():
    runner = _runner(SeedSplits(lambda seed: SPLITS, True), selection="topk", calibration="contextual",
                     seeds=(1,), save_predictions=True)
    runner.run()
    scores = {p["item"]: np.array(p["scores"]) for p in runner.predictions}
    topk = TopK([f"{r['text']}" for r in TRAIN])
    method, prompt = METHODS["concat"], runner.prompt_for(1)
    chosen = [topk.select(r["text"], 2, exclude=[]) for r in TEST]
    assert chosen[0] != chosen[1]  # the items' contexts differ, so item 0's would be wrong for item 1
    for i, row in enumerate(TEST):
        demos = [prompt.demo(j, TRAIN[j]) for j in chosen[i]]
        raw = method(runner.lm, prompt, demos, [prompt.test_item(i, row, 2)], MethodOptions()).scores
        cf = method(runner.lm, prompt, demos, prompt.content_free_items(row, 2), MethodOptions()).scores
        expected = calibrate(np.array(raw), np.array(cf), "contextual")[0]
        assert np.allclose(scores[i], expected, atol=1e-6), i


def test_every_topk_timing_covers_all_items():
    record = _runner(SeedSplits(lambda seed: SPLITS, True), selection="topk", seeds=(1,)).run()[0]
    n = len(TEST)
    assert record["seconds"] == pytest.approx(record["seconds_per_item"] * n, rel=1e-9)
    assert record["demos_used_mean"] == 2.0
