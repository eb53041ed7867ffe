"""Perplexity through the cache vs one forward, and the re-encoding baselines.

Run: python -m pytest tests/icl_eval/test_perplexity.py -q
Tolerance 1e-9 on float64 per-token NLL (rounding only).
"""

from __future__ import annotations

import numpy as np
import torch

from icl_eval.books import iter_books
from icl_eval.perplexity import bucket_report, cached_nll, evaluate, window_nll
from tests.icl_eval.conftest import tiny_evalm


def test_cached_perplexity_equals_one_forward(lm):
    torch.manual_seed(1)
    tokens = torch.randint(0, 256, (150,)).tolist()
    nll = cached_nll(lm, tokens, segment_tokens=37)  # segments that cut blocks and chunks
    logits = lm.forward(torch.tensor([tokens]))[0]
    ref = torch.nn.functional.cross_entropy(logits[:-1], torch.tensor(tokens[1:]), reduction="none").numpy()
    assert nll.shape == ref.shape and np.abs(nll - ref).max() <= 1e-9
    assert abs(np.exp(nll.mean()) - np.exp(ref.mean())) <= 1e-9


def test_baselines_score_every_token_once_with_bounded_context():
    lm = tiny_evalm("full", dtype=torch.float64)
    tokens = torch.randint(0, 256, (100,)).tolist()
    full = cached_nll(lm, tokens, 1000)
    nonover = window_nll(lm, tokens, window=32, stride=31)
    sliding = window_nll(lm, tokens, window=32, stride=8)
    assert np.isfinite(nonover).all() and np.isfinite(sliding).all() and len(nonover) == 99
    assert np.abs(nonover[:31] - full[:31]).max() <= 1e-9  # the first window sees the same context
    assert np.abs(nonover[40:] - full[40:]).max() > 1e-6  # later windows do not (the oracle can fail)
    assert np.abs(sliding[:31] - full[:31]).max() <= 1e-9


def test_report_buckets_and_word_perplexity(tmp_path):
    lm = tiny_evalm("eva", dtype=torch.float64)
    (tmp_path / "a.txt").write_text("one two three four five six seven eight nine ten " * 8)
    (tmp_path / "b.txt").write_text("short book here")
    books = list(iter_books([tmp_path]))
    res = evaluate(lm, books, max_tokens=300, segment_tokens=64, buckets=(32, 128, 512), window=64, stride=32)
    cached = res["protocols"]["cached"]["buckets"]
    assert [r["books"] for r in cached] == [2, 1, 1]  # only the long book reaches 32+
    assert sum(r["tokens"] for r in cached) == sum(b["tokens"] for b in res["books"])
    assert all(r["word_ppl"] > r["token_ppl"] for r in cached)  # several byte tokens per word
    assert set(res["protocols"]) == {"cached", "nonoverlap", "sliding"}
