"""The Hugging Face path on a tiny random GPT-2 saved to a temporary folder (no download).

Run: python -m pytest tests/icl_eval/test_hf.py -q
Tolerance 1e-6 on float64 weights (rounding only, ~1e-14 in practice).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from evalm.text.tokenizer import ByteTokenizer
from evalm.icl_eval.methods.decoder import METHODS, MethodOptions, make_groups
from tests.icl_eval.conftest import demos_and_items, save_tiny_gpt2

transformers = pytest.importorskip("transformers")
TOL = 1e-6


@pytest.fixture(scope="module")
def hf_lm(tmp_path_factory):
    from evalm.icl_eval.models.hf import load_hf

    folder = save_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2"))
    return load_hf(folder, tokenizer=ByteTokenizer(), dtype="float64", attn_implementation="eager")


def run(name, lm, prompt, demos, items, **opts):
    return np.array(METHODS[name](lm, prompt, demos, items, MethodOptions(**opts)).scores)


def test_concat_incremental_structured_run_and_agree(hf_lm, synth):
    prompt, splits = synth
    demos, items = demos_and_items(prompt, splits, 21)
    a = run("concat", hf_lm, prompt, demos, items)
    b = run("incremental", hf_lm, prompt, demos, items, segment_tokens=5)
    c = run("structured", hf_lm, prompt, demos, items, n_groups=1)
    assert np.abs(a - b).max() <= TOL
    assert np.abs(a - c).max() <= TOL
    assert np.ptp(a) > 1e-3
    d = run("structured", hf_lm, prompt, demos, items, n_groups=3)
    assert np.isfinite(d).all() and np.abs(d - a).max() > 1e-4


def explicit_structured(hf_lm, groups, item, right_aligned: bool = True) -> list[float]:
    """Structured prompting as ONE forward over [G_1; ...; G_M; test] with an explicit additive mask:
    each group causal within itself only, the test tokens see every group and themselves (causally)
    with their own logits raised by log M; groups end at L - 1 (right-aligned) or start at 0, the
    test starts at L = the longest group's length."""
    from evalm.icl_eval.methods.scoring import score_candidates

    M, L = len(groups), max(len(g.tokens) for g in groups)
    expected = []
    for cand in item.candidates:
        tokens, positions, owner = [], [], []
        for gi, g in enumerate(groups):
            tokens += g.tokens
            first = L - len(g.tokens) if right_aligned else 0
            positions += list(range(first, first + len(g.tokens)))
            owner += [gi] * len(g.tokens)
        n_ctx = len(tokens)
        tokens += list(cand.tokens)
        positions += list(range(L, L + len(cand.tokens)))
        owner += [M] * len(cand.tokens)
        n = len(tokens)
        mask = torch.full((n, n), torch.finfo(torch.float64).min, dtype=torch.float64)
        for q in range(n):
            for k in range(q + 1):
                if owner[q] == owner[k]:
                    mask[q, k] = math.log(M) if owner[q] == M else 0.0
                elif owner[q] == M:  # the test token sees every group's entries
                    mask[q, k] = 0.0
        with torch.no_grad():
            logits = hf_lm.model(input_ids=torch.tensor([tokens]), position_ids=torch.tensor([positions]),
                                 attention_mask=mask[None, None]).logits
        expected.append(score_candidates(logits[:, n_ctx:], [cand], "instance-sum")[0])
    return expected


def test_log_m_boost_matches_an_explicit_masked_attention_forward(hf_lm, synth):
    prompt, splits = synth
    demos, items = demos_and_items(prompt, splits, 9)
    groups = make_groups(prompt, demos, MethodOptions(n_groups=3))
    ours = run("structured", hf_lm, prompt, demos, items, n_groups=3)
    for item, row in zip(items, ours):
        assert np.abs(np.array(explicit_structured(hf_lm, groups, item)) - row).max() <= TOL


def test_structured_right_aligns_groups_of_unequal_length(hf_lm, synth):
    """Groups of different lengths: `align="mask"` (each group ends right before the test) equals the
    explicit right-aligned forward; `align="none"` (every group from position 0) is the left-aligned
    forward instead, and its numbers differ from the right-aligned ones by far more than rounding."""
    prompt, splits = synth
    words = ["a", "bcdefghijk", "lm", "nopqrstuvwxyzabcdefg", "hij", "klmnop"]
    demos = [prompt.demo(i, {"x": w, "label": i % 4}) for i, w in enumerate(words)]
    _, items = demos_and_items(prompt, splits, 0)
    groups = make_groups(prompt, demos, MethodOptions(n_groups=3))
    assert len({len(g.tokens) for g in groups}) == 3  # three different lengths: offsets 0, and two > 0
    aligned = run("structured", hf_lm, prompt, demos, items, n_groups=3)
    unaligned = run("structured", hf_lm, prompt, demos, items, n_groups=3, align="none")
    for item, row, row_none in zip(items, aligned, unaligned):
        right = np.array(explicit_structured(hf_lm, groups, item))
        assert np.abs(right - row).max() <= TOL
        assert np.abs(np.array(explicit_structured(hf_lm, groups, item, right_aligned=False)) - row_none).max() <= TOL
    assert np.abs(aligned - unaligned).max() > 1e-2
