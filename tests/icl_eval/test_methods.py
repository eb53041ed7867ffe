"""Exactness oracles of the ICL methods (docs/evaluation.md) on tiny EVA and full-attention EvalmModels.

Run: python -m pytest tests/icl_eval/test_methods.py -q
Tolerance 1e-6 on float64 models (the paths differ only in the order of the arithmetic: one forward
vs cached segments and merged groups, so the differences are rounding, ~1e-14). One float32 check
uses a relative 1e-6: a score near -12 has an ulp of ~1e-6 in float32.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from evalm.icl_eval.methods.decoder import METHODS, MethodOptions, PromptTooLong, make_groups, structured
from tests.icl_eval.conftest import demos_and_items

TOL = 1e-6


def scores(method, lm, prompt, demos, items, **opts):
    return np.array(METHODS[method](lm, prompt, demos, items, MethodOptions(**opts)).scores)


def test_incremental_equals_concat(lm, synth):
    prompt, splits = synth
    demos, items = demos_and_items(prompt, splits, 30)  # 1 + 30*3 - 1 = 90 tokens: blocks, chunks, several segments
    a = scores("concat", lm, prompt, demos, items)
    b = scores("incremental", lm, prompt, demos, items, segment_tokens=7)  # odd segments: cache split points
    assert np.abs(a - b).max() <= TOL
    assert np.ptp(a) > 1e-3  # the scores are not all equal (an oracle that cannot fail is a defect)


def test_incremental_equals_concat_float32(synth):
    from tests.icl_eval.conftest import tiny_evalm

    prompt, splits = synth
    demos, items = demos_and_items(prompt, splits, 30)
    for attention in ("eva", "full"):
        lm = tiny_evalm(attention)
        a = scores("concat", lm, prompt, demos, items)
        b = scores("incremental", lm, prompt, demos, items, segment_tokens=7)
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=0)


@pytest.mark.parametrize("attention", ["eva", "full"])
def test_structured_and_saicl_with_one_group_equal_concat_for_every_group_length(synth, attention):
    """Merging one cache is that cache (evalm.cache.merge): the test tokens continue its blocks and
    chunks. Group lengths 3..60 cross every window (16) and chunk (4) alignment; before the fix a
    3-token group (one demonstration, SAICL's groups here) was 2.2 nats off on a tuned model."""
    from tests.icl_eval.conftest import tiny_evalm

    lm = tiny_evalm(attention, dtype=torch.float64)
    prompt, splits = synth
    for k in range(1, 21):
        demos, items = demos_and_items(prompt, splits, k)
        a = scores("concat", lm, prompt, demos, items)
        assert np.abs(a - scores("structured", lm, prompt, demos, items, n_groups=1)).max() <= 1e-10, k
        if k == 1:
            assert np.abs(a - scores("saicl", lm, prompt, demos, items)).max() <= 1e-10
    assert np.ptp(a) > 1e-3


def test_log_m_boost_equals_repeating_the_group(lm, synth):
    """M identical groups + log M on the test's own logits == one group (Eq. 2: 'repeat the test M times').

    Each copy adds the same exp-mass to the softmax denominator, so the union over M copies equals
    one copy with its mass times M; raising the own logits by exactly log M restores the ratio.
    """
    prompt, splits = synth
    demos, items = demos_and_items(prompt, splits, 16)  # 48 tokens: a multiple of window_size (EVA)
    one = scores("concat", lm, prompt, demos, items)
    opts = MethodOptions(n_groups=1)
    group = make_groups(prompt, demos, opts)[0]
    from evalm.icl_eval.methods.decoder import Merge, _grouped

    for m in (2, 3):
        copies = [type(group)(list(group.demo_ids), list(group.tokens)) for _ in range(m)]
        boosted = np.array(_grouped(lm, prompt, Merge(copies, math.log(m)), items, opts, None).scores)
        plain = np.array(_grouped(lm, prompt, Merge(copies, 0.0), items, opts, None).scores)
        assert np.abs(boosted - one).max() <= TOL
        assert np.abs(plain - one).max() > 1e-3  # without the rescale the test over-attends to the context


@pytest.mark.parametrize("method", ["saicl", "structured"])
def test_one_demo_per_group_is_order_invariant(lm, synth, method):
    prompt, splits = synth
    demos, items = demos_and_items(prompt, splits, 7)
    opts = {"n_groups": 7} if method == "structured" else {}
    a = scores(method, lm, prompt, demos, items, **opts)
    shuffled = list(demos)
    random.Random(3).shuffle(shuffled)
    b = scores(method, lm, prompt, shuffled, items, **opts)
    assert np.abs(a - b).max() <= TOL
    # ...whereas concatenation does depend on the order (so the check above can fail)
    assert np.abs(scores("concat", lm, prompt, demos, items) - scores("concat", lm, prompt, shuffled, items)).max() > 1e-4


def test_groups_keep_every_demo_and_record_tokens(synth):
    prompt, splits = synth
    demos, _ = demos_and_items(prompt, splits, 25)
    groups = make_groups(prompt, demos, MethodOptions(group_tokens=32))
    assert [i for g in groups for i in g.demo_ids] == [d.item_id for d in demos]  # order kept, nothing dropped
    assert all(len(g.tokens) <= 32 for g in groups) and len(groups[-1].tokens) < 32  # the unfilled last group is kept
    with pytest.raises(PromptTooLong):
        make_groups(prompt, demos, MethodOptions(group_tokens=2))


def test_window_overflow_is_never_silent(synth):
    from tests.icl_eval.conftest import tiny_evalm

    lm = tiny_evalm("full")
    lm.max_positions = 40
    prompt, splits = synth
    demos, items = demos_and_items(prompt, splits, 20)  # 60 tokens of context > 40
    with pytest.raises(PromptTooLong, match="fit"):
        METHODS["concat"](lm, prompt, demos, items, MethodOptions())
    with pytest.raises(PromptTooLong):
        METHODS["incremental"](lm, prompt, demos, items, MethodOptions())
    res = METHODS["concat"](lm, prompt, demos, items, MethodOptions(on_overflow="drop_left"))
    used = res.info["demos_used"]
    assert all(0 < u < 20 for u in used)
    # the kept demonstrations are the LAST ones (dropped from the left), and they fit
    kept = demos[-used[0]:]
    assert len(prompt.context(kept)) + max(len(c.tokens) for c in items[0].candidates) <= 40


def test_every_method_runs_at_zero_shots(lm, synth):
    prompt, splits = synth
    _, items = demos_and_items(prompt, splits, 0)
    base = scores("concat", lm, prompt, [], items)
    for name in METHODS:
        assert np.abs(scores(name, lm, prompt, [], items) - base).max() <= TOL, name


def test_ensemble_single_demo_equals_incremental(lm, synth):
    prompt, splits = synth
    demos, items = demos_and_items(prompt, splits, 1)
    assert np.abs(scores("ensemble", lm, prompt, demos, items) - scores("incremental", lm, prompt, demos, items)).max() <= TOL


WORDS = ("alpha", "be", "gamma ray", "delta")


def _mean_logits_oracle(lm, prompt, groups, item, rule: str) -> list[float]:
    """SAICL §5.3 by hand: each group + candidate in one forward, the logits averaged over the groups,
    then log-softmax and the rule's span (instance-sum, answer-mean) or the answer's first logit (answer-logit)."""
    out = []
    for cand in item.candidates:
        per_group = []
        for g in groups:
            seq = torch.tensor([list(g) + list(cand.tokens)])
            per_group.append(lm.forward(seq)[0, len(g):].double())
        mean = torch.stack(per_group).mean(0)  # (T, V): position t predicts token t + 1
        if rule == "answer-logit":
            out.append(float(mean[cand.answer_start - 1, cand.tokens[cand.answer_start]]))
            continue
        logp = torch.log_softmax(mean, -1)
        span = range(max(cand.body_start, 1), len(cand.tokens)) if rule == "instance-sum" else \
            range(cand.answer_start, cand.answer_end)
        lps = [float(logp[t - 1, cand.tokens[t]]) for t in span]
        out.append(sum(lps) if rule == "instance-sum" else sum(lps) / len(lps))
    return out


@pytest.mark.parametrize("labels, rule", [(None, "instance-sum"), (WORDS, "answer-mean"), (WORDS, "instance-sum"),
                                          (WORDS, "answer-logit")])
def test_ensemble_mean_logits_averages_the_groups_logits_then_scores(lm, synth, labels, rule):
    """`ensemble_reduce="mean_logits"` == the hand computation above, for one- and multi-token answers
    (labels "be" .. "gamma ray": 2 to 9 byte tokens), and it is not the mean of the groups' scores."""
    from evalm.icl_eval.tasks.prompts import PromptBuilder
    from evalm.icl_eval.tasks.synthetic import SyntheticConfig
    from evalm.icl_eval.tasks.task import Task

    prompt, splits = synth
    if labels:
        prompt = PromptBuilder(Task("words", SyntheticConfig().template, labels), prompt.tokenizer)
    demos, items = demos_and_items(prompt, splits, 6)
    groups = [prompt.context(demos[:3]), prompt.context(demos[3:])]  # n_groups=2: near-equal halves, in order
    got = scores("ensemble", lm, prompt, demos, items, n_groups=2, ensemble_reduce="mean_logits", scoring=rule)
    want = np.array([_mean_logits_oracle(lm, prompt, groups, it, rule) for it in items])
    assert np.abs(got - want).max() <= TOL
    mean_score = scores("ensemble", lm, prompt, demos, items, n_groups=2, ensemble_reduce="mean_score", scoring=rule)
    if rule != "answer-logit":  # a raw logit is linear: there the mean of logits is the mean of scores
        assert np.abs(got - mean_score).max() > 1e-3
    if labels:
        assert max(c.answer_end - c.answer_start for c in items[0].candidates) > 1
