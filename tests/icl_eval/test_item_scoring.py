"""One test prefix per item (icl_eval/methods/item_scoring.py) and the per-item left-drop (methods.incremental).

Run: python -m pytest tests/icl_eval/test_item_scoring.py -q
Oracles: the old per-candidate re-encoding (`test_prefix="reencode"`) and `concat` (one forward, no
cache). Float64 models must agree to rounding (1e-12; the paths differ only in the order of the
arithmetic), float32 ones to 1e-6 relative (an ulp of a score near -30 is ~2e-6 absolute).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from evalm.text.tokenizer import ByteTokenizer
from evalm.icl_eval.models.lm import EvalmLM
from evalm.icl_eval.methods.decoder import METHODS, MethodOptions
from evalm.icl_eval.tasks.prompts import PromptBuilder
from evalm.icl_eval.tasks.task import Task
from tests.icl_eval.conftest import save_tiny_gpt2, tiny_evalm

EXACT = 1e-12
SINGLE = Task("single", "Review: {text} Sentiment:{label}", ("A", "B", "C", "D", "E", "F"))
"""Single-byte labels at the end: the prefix's one forward scores every candidate."""
MULTI = Task("multi", "Review: {text} Sentiment: {label}.", ("good", "bad", "fine", "awful", "superb"))
"""Multi-token labels of unequal length, text after the slot."""


def rows(n: int, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    words = ["plot", "cast", "dull", "great", "slow", "fun", "dark", "warm"]
    return [{"text": " ".join(rng.choice(words, size=int(rng.integers(1, 9)))), "label": int(rng.integers(0, 5))}
            for _ in range(n)]


def setup(task: Task, n_demos: int, n_items: int = 4):
    prompt = PromptBuilder(task, ByteTokenizer())
    data = rows(n_demos + n_items)
    demos = [prompt.demo(i, r) for i, r in enumerate(data[:n_demos])]
    items = [prompt.test_item(i, r, n_demos) for i, r in enumerate(data[n_demos:])]
    return prompt, demos, items


def run(name, lm, prompt, demos, items, **opts):
    res = METHODS[name](lm, prompt, demos, items, MethodOptions(**opts))
    return np.array(res.scores), res.info


METHOD_OPTS = [("incremental", {}), ("structured", {"n_groups": 3}), ("saicl", {}), ("ensemble", {"n_groups": 2})]


@pytest.mark.parametrize("task", [SINGLE, MULTI], ids=["single-token", "multi-token"])
@pytest.mark.parametrize("attention", ["eva", "full"])
def test_shared_test_prefix_equals_reencoding_on_evalm(task, attention):
    prompt, demos, items = setup(task, 7, n_items=3)
    lm = tiny_evalm(attention, dtype=torch.float64)
    for name, opts in METHOD_OPTS:
        for rule in ("instance-sum", "answer-logit") if name == "incremental" else ("answer-mean",):
            old, _ = run(name, lm, prompt, demos, items, scoring=rule, test_prefix="reencode", **opts)
            new, _ = run(name, lm, prompt, demos, items, scoring=rule, test_prefix="shared", **opts)
            assert np.ptp(old) > 1e-3
            assert np.abs(new - old).max() <= EXACT, (name, rule, np.abs(new - old).max())
    lm = tiny_evalm(attention, dtype=torch.float32)
    old, _ = run("incremental", lm, prompt, demos, items, test_prefix="reencode")
    new, _ = run("incremental", lm, prompt, demos, items)
    np.testing.assert_allclose(new, old, rtol=1e-6, atol=0)  # float32: an ulp of a score near -300 is 3e-5


class CountingLM(EvalmLM):
    """A real EvalmLM that also counts what it is fed after a cache (the work the prefix saves)."""

    def __init__(self, inner: EvalmLM):
        super().__init__(inner.model, inner.tokenizer, inner.name, inner.max_positions)
        self.calls, self.rows_tokens = 0, 0

    def extend(self, state, tokens):
        self.calls += 1
        self.rows_tokens += tokens.numel()
        return super().extend(state, tokens)


def test_single_token_candidates_are_scored_from_one_forward():
    prompt, _, items = setup(SINGLE, 0, n_items=3)
    lm = CountingLM(tiny_evalm("eva", dtype=torch.float64))
    run("incremental", lm, prompt, [], items)
    prefixes = sum(len(it.candidates[0].tokens) - 1 for it in items)
    assert (lm.calls, lm.rows_tokens) == (len(items), prefixes)  # one forward per item, the prefix only
    lm.calls = lm.rows_tokens = 0
    run("incremental", lm, prompt, [], items, test_prefix="reencode")
    assert lm.rows_tokens == sum(6 * len(it.candidates[0].tokens) for it in items)  # 6 labels, each fed whole


def test_multi_token_candidates_feed_the_shared_prefix_once():
    prompt, _, items = setup(MULTI, 0, n_items=2)
    lm = CountingLM(tiny_evalm("full", dtype=torch.float64))
    run("incremental", lm, prompt, [], items)
    assert lm.calls == 2 * len(items)  # the prefix, then one batch of the answers' tokens
    for it in items:
        longest = max(len(c.tokens) for c in it.candidates)
        assert len(it.candidates[0].tokens) - 5 > 0 and longest < len(it.candidates[0].tokens) + 5
    fed = lm.rows_tokens
    lm.rows_tokens = 0
    run("incremental", lm, prompt, [], items, test_prefix="reencode")
    assert fed < lm.rows_tokens / 2


@pytest.mark.parametrize("attention", ["eva", "full"])
def test_incremental_left_drop_is_decided_per_item_like_concat(attention):
    """Past the window each item keeps what concat keeps for it (room = window - its longest
    candidate), so incremental with drop_left equals a left-dropping concat item by item."""
    lm = tiny_evalm(attention, dtype=torch.float64)
    lm.max_positions = 160
    prompt = PromptBuilder(MULTI, ByteTokenizer())
    data = rows(40, seed=1)
    demos = [prompt.demo(i, r) for i, r in enumerate(data[:30])]
    items = [prompt.test_item(i, {"text": "fun " * n, "label": 0}, 30) for i, n in enumerate((1, 6, 12, 3, 18, 9))]
    assert len(prompt.context(demos)) > 3 * lm.max_positions  # far past the window
    a, info_a = run("concat", lm, prompt, demos, items, on_overflow="drop_left")
    b, info_b = run("incremental", lm, prompt, demos, items, on_overflow="drop_left")
    assert info_b["demos_used"] == info_a["demos_used"]
    assert len(set(info_a["demos_used"])) >= 3  # the items really keep different numbers of demonstrations
    assert info_b["context_encodings"] == len(set(info_a["demos_used"]))
    assert np.abs(a - b).max() <= EXACT
    one, _ = run("incremental", lm, prompt, demos, items[:1], on_overflow="drop_left")
    assert np.abs(one[0] - b[0]).max() == 0.0  # an item's scores do not depend on the items beside it


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    pytest.importorskip("transformers")
    return save_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2"), n_positions=512)


@pytest.mark.parametrize("task", [SINGLE, MULTI], ids=["single-token", "multi-token"])
def test_shared_test_prefix_equals_reencoding_on_hf(gpt2_folder, task):
    from evalm.icl_eval.models.hf import load_hf

    prompt, demos, items = setup(task, 7, n_items=3)
    for dtype in ("float64", "float32"):
        lm = load_hf(gpt2_folder, tokenizer=ByteTokenizer(), dtype=dtype, attn_implementation="eager")
        for name, opts in METHOD_OPTS[:3]:
            old, _ = run(name, lm, prompt, demos, items, test_prefix="reencode", **opts)
            new, _ = run(name, lm, prompt, demos, items, **opts)
            assert np.ptp(old) > 1e-3
            if dtype == "float64":
                assert np.abs(new - old).max() <= EXACT, (name, np.abs(new - old).max())
            else:
                np.testing.assert_allclose(new, old, rtol=1e-6, atol=0)


def test_hf_float64_models_score_exactly(gpt2_folder):
    """Logits in the model's own dtype: a float64 model's scores equal a float64
    computation straight from `transformers` to rounding; float32 logits would be ~1e-6 off."""
    from evalm.icl_eval.models.hf import load_hf

    lm = load_hf(gpt2_folder, tokenizer=ByteTokenizer(), dtype="float64", attn_implementation="eager")
    prompt, demos, items = setup(MULTI, 5, n_items=2)
    assert lm.forward(torch.tensor([[1, 2, 3]])).dtype == torch.float64
    ours, _ = run("incremental", lm, prompt, demos, items)
    ctx = prompt.context(demos)
    for item, row in zip(items, ours):
        for cand, score in zip(item.candidates, row):
            tokens = torch.tensor([ctx + list(cand.tokens)])
            with torch.no_grad():
                logits = lm.model(input_ids=tokens).logits[0]
            logp = torch.log_softmax(logits, -1)
            start = len(ctx) + cand.body_start
            expected = sum(float(logp[t - 1, tokens[0, t]]) for t in range(start, tokens.shape[1]))
            assert abs(score - expected) <= EXACT
