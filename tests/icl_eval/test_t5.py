"""SAICL on T5 (icl_eval/models/t5.py, icl_eval/methods/encoder_decoder.py) against independent oracles, float64.

Run: python -m pytest tests/icl_eval/test_t5.py -q
Tolerance 1e-10; the differences are rounding, ~1e-14 in practice. The tiny T5 gets
wide random weights (std 0.3) so that a wrong mask or position moves the scores far above that.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch

from evalm.icl_eval.methods.encoder_decoder import demo_segments, split_item
from evalm.icl_eval.methods.decoder import METHODS, MethodOptions
from evalm.icl_eval.tasks.prompts import PromptBuilder
from evalm.icl_eval.tasks.synthetic import SyntheticConfig, episode, synthetic_task
from evalm.icl_eval.models.t5 import Segments, structured_encode, tiny_t5
from tests.icl_eval.conftest import demos_and_items

pytest.importorskip("transformers")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models are all small ops: one thread is faster and steadier on a shared 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
TOL = 1e-10


@pytest.fixture(scope="module")
def t5():
    return tiny_t5(dtype=torch.float64, init_std=0.3)


@pytest.fixture(scope="module")
def synth_t5(t5):
    cfg = SyntheticConfig()
    return PromptBuilder(synthetic_task(cfg), t5.tokenizer), episode(0, cfg)


def run(name, lm, prompt, demos, items, **opts):
    return np.array(METHODS[name](lm, prompt, demos, items, MethodOptions(**opts)).scores)


def oracle_encode(model, demos: list[tuple[int, ...]], test: tuple[int, ...], cross: str):
    """The unmodified T5 encoder blocks over the flat, unpadded [d_1 ... d_k test] with an explicit SAICL mask
    (Fig. 1) and a bias assembled from the stock `compute_bias`: per segment over its own positions; between
    a demonstration and the test none ("none"), or the stock bias of [d_i test] alone ("aligned")."""
    enc = model.encoder
    attn = enc.block[0].layer[0].SelfAttention
    lengths = [len(d) for d in demos] + [len(test)]
    starts = np.cumsum([0] + lengths)
    N, n_t, t0 = int(starts[-1]), len(test), int(starts[-2])
    bias = torch.zeros(1, attn.n_heads, N, N, dtype=torch.float64)
    allowed = torch.zeros(N, N, dtype=torch.bool)
    bias[..., t0:, t0:] = attn.compute_bias(n_t, n_t)
    allowed[t0:, :] = True
    for i, n in enumerate(lengths[:-1]):
        a = int(starts[i])
        pair = attn.compute_bias(n + n_t, n + n_t)  # d_i directly before the test
        bias[..., a:a + n, a:a + n] = pair[..., :n, :n]
        allowed[a:a + n, a:a + n] = allowed[a:a + n, t0:] = True
        if cross == "aligned":
            bias[..., a:a + n, t0:] = pair[..., :n, n:]
            bias[..., t0:, a:a + n] = pair[..., n:, :n]
    mask = torch.zeros(1, 1, N, N, dtype=torch.float64).masked_fill(~allowed, torch.finfo(torch.float64).min)
    h = enc.embed_tokens(torch.tensor([sum(demos, ()) + test]))
    for block in enc.block:
        h = block(h, attention_mask=mask, position_bias=bias)[0]
    return enc.final_layer_norm(h)


def random_prompts(seed: int, k: int):
    r = random.Random(seed)
    demos = [tuple(r.randrange(1, 256) for _ in range(r.randrange(2, 9))) for _ in range(k)]
    return demos, tuple(r.randrange(1, 256) for _ in range(r.randrange(2, 7)))


@pytest.mark.parametrize("cross", ["none", "aligned"])
def test_structured_encoder_equals_explicit_mask_forward_of_stock_t5(t5, cross):
    """Appendix B's blocked attention, with padding and a batch of two prompts, == the flat masked forward."""
    prompts = [random_prompts(s, 5) for s in (1, 2)]
    seg = Segments.build([d for d, _ in prompts], [t for _, t in prompts], t5.pad_id)
    with torch.no_grad():
        hidden, mask = structured_encode(t5.model, seg, cross)
        for b, (demos, test) in enumerate(prompts):
            want = oracle_encode(t5.model, demos, test, cross)[0]
            got = hidden[b][mask[b]]
            assert got.shape == want.shape
            assert (got - want).abs().max() <= TOL
            full = t5.model.encoder(input_ids=torch.tensor([sum(demos, ()) + test])).last_hidden_state[0]
            assert (got - full).abs().max() > 1e-3  # the structure is not full attention


@pytest.mark.parametrize("cross", ["none", "aligned"])
def test_saicl_scores_are_exactly_permutation_invariant(t5, synth_t5, cross):
    prompt, splits = synth_t5
    demos, items = demos_and_items(prompt, splits, 5)
    base = run("saicl", t5, prompt, demos, items, t5_cross=cross)
    assert np.ptp(base) > 1e-3
    for perm in itertools.islice(itertools.permutations(range(5)), 1, 120, 29):
        got = run("saicl", t5, prompt, [demos[i] for i in perm], items, t5_cross=cross)
        assert np.abs(got - base).max() <= TOL
    shuffled = run("concat", t5, prompt, demos[::-1], items)  # full attention is order-sensitive
    assert np.abs(shuffled - run("concat", t5, prompt, demos, items)).max() > 1e-4


def test_saicl_method_scores_equal_the_decoder_over_the_oracle_encoding(t5, synth_t5):
    prompt, splits = synth_t5
    demos, items = demos_and_items(prompt, splits, 4)
    got = run("saicl", t5, prompt, demos, items, scoring="answer-sum")
    segs = demo_segments(prompt, demos)
    for row, item in zip(got, items):
        for score, (test, cand) in zip(row, split_item(t5, prompt, item)):
            with torch.no_grad():
                hidden = oracle_encode(t5.model, segs, test, "none")
                logits = t5.model(encoder_outputs=(hidden,), decoder_input_ids=torch.tensor([cand.tokens])).logits
            lp = torch.log_softmax(logits[0, :-1], -1).gather(-1, torch.tensor(cand.tokens[1:])[:, None])[:, 0]
            assert abs(score - float(lp[: cand.answer_end - 1].sum())) <= TOL


def test_saicl_with_one_demonstration_equals_concat(t5, synth_t5):
    prompt, splits = synth_t5
    demos, items = demos_and_items(prompt, splits, 1, n_items=5)
    concat = run("concat", t5, prompt, demos, items)
    assert np.abs(run("saicl", t5, prompt, demos, items, t5_cross="aligned") - concat).max() <= TOL
    # the paper's variant drops the demo<->test position bias, so it is a different function
    assert np.abs(run("saicl", t5, prompt, demos, items, t5_cross="none") - concat).max() > 1e-4


def test_fid_equals_pairs_encoded_one_by_one_with_the_stock_encoder(t5, synth_t5):
    prompt, splits = synth_t5
    demos, items = demos_and_items(prompt, splits, 6)
    demos[2] = prompt.demo(99, {"x": "abcdefgh", "label": 1})  # a longer pair: the batch pads
    got = run("fid", t5, prompt, demos, items, scoring="instance-sum")
    segs = demo_segments(prompt, demos)
    for row, item in zip(got, items):
        for score, (test, cand) in zip(row, split_item(t5, prompt, item)):
            with torch.no_grad():
                hidden = torch.cat([t5.model.encoder(input_ids=torch.tensor([s + test])).last_hidden_state
                                    for s in segs], 1)
                logits = t5.model(encoder_outputs=(hidden,), decoder_input_ids=torch.tensor([cand.tokens])).logits
            lp = torch.log_softmax(logits[0, :-1], -1).gather(-1, torch.tensor(cand.tokens[1:])[:, None])[:, 0]
            assert abs(score - float(lp.sum())) <= TOL
    assert np.abs(got - run("saicl", t5, prompt, demos, items, scoring="instance-sum")).max() > 1e-4


@pytest.mark.parametrize("reduce", ["mean_score", "mean_prob"])
def test_ensemble_reduces_the_one_demonstration_concat_scores(t5, synth_t5, reduce):
    prompt, splits = synth_t5
    demos, items = demos_and_items(prompt, splits, 4)
    per = np.stack([run("concat", t5, prompt, [d], items) for d in demos])  # (k, N, C)
    if reduce == "mean_score":
        want = per.mean(0)
    else:
        logp = per - np.logaddexp.reduce(per, axis=2, keepdims=True)
        want = np.log(np.exp(logp).mean(0))
    assert np.abs(run("ensemble", t5, prompt, demos, items, ensemble_reduce=reduce) - want).max() <= TOL


def test_ensemble_mean_logits_averages_the_pairs_decoder_logits(t5, synth_t5):
    """SAICL §5.3 by hand: each (d_i, t) pair through the stock T5, the decoder logits averaged over
    the pairs, then log-softmax over the instance (multi-token: answer, rest of the instance, </s>)."""
    prompt, splits = synth_t5
    demos, items = demos_and_items(prompt, splits, 4)
    got = run("ensemble", t5, prompt, demos, items, ensemble_reduce="mean_logits", scoring="instance-sum")
    segs = demo_segments(prompt, demos)
    for row, item in zip(got, items):
        for score, (test, cand) in zip(row, split_item(t5, prompt, item)):
            assert len(cand.tokens) > 2  # more than one scored token
            with torch.no_grad():
                mean = torch.stack([t5.model(input_ids=torch.tensor([s + test]),
                                             decoder_input_ids=torch.tensor([cand.tokens])).logits[0]
                                    for s in segs]).mean(0)
            lp = torch.log_softmax(mean[:-1], -1).gather(-1, torch.tensor(cand.tokens[1:])[:, None])
            assert abs(score - float(lp.sum())) <= TOL
    mean_score = run("ensemble", t5, prompt, demos, items, ensemble_reduce="mean_score", scoring="instance-sum")
    assert np.abs(got - mean_score).max() > 1e-3


def test_no_demonstrations_is_the_encoder_over_the_test_alone(t5, synth_t5):
    prompt, splits = synth_t5
    _, items = demos_and_items(prompt, splits, 0)
    base = run("concat", t5, prompt, [], items)
    for name in ("saicl", "fid", "ensemble"):
        assert np.abs(run(name, t5, prompt, [], items) - base).max() <= TOL


def test_fid_on_a_decoder_only_model_is_a_clear_error(synth):
    from tests.icl_eval.conftest import tiny_evalm

    prompt, splits = synth
    demos, items = demos_and_items(prompt, splits, 2)
    with pytest.raises(ValueError, match="encoder-decoder"):
        run("fid", tiny_evalm("full"), prompt, demos, items)
