"""Perplexity through the cache vs one forward, and the re-encoding baselines.

Run: python -m pytest tests/icl_eval/test_perplexity.py -q
Tolerance 1e-9 on float64 per-token NLL (rounding only).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from evalm.icl_eval.config import PerplexityConfig
from evalm.icl_eval.perplexity.books import iter_books
from evalm.icl_eval.perplexity.lengths import bucket_report, cached_nll, evaluate, window_nll
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
    config = PerplexityConfig(max_tokens=300, segment_tokens=64, buckets=(32, 128, 512), window_tokens=64, stride_tokens=32)
    res = evaluate(lm, books, config)
    cached = res["protocols"]["cached"]["buckets"]
    assert [r["books"] for r in cached] == [2, 1, 1]  # only the long book reaches 32+
    assert sum(r["tokens"] for r in cached) == sum(b["tokens"] for b in res["books"])
    assert all(r["word_ppl"] > r["token_ppl"] for r in cached)  # several byte tokens per word
    assert set(res["protocols"]) == {"cached", "nonoverlap", "sliding"}


def test_a_bucket_of_one_long_word_reports_infinite_word_perplexity():
    """Text without spaces (CJK, code) can make one "word" of hundreds of tokens: its NLL per word
    (here 3,000 nats) is past exp's range, so word perplexity is inf, not an OverflowError."""
    nll = np.full(600, 5.0)
    rows = bucket_report([(nll, [0], "no-spaces", np.ones(600, dtype=np.int64))], buckets=(600,))
    assert rows[0]["word_ppl"] == float("inf")
    assert rows[0]["token_ppl"] == pytest.approx(np.exp(5.0))


def _write_shards(folder, ids, vocab_size=257):
    """A token-shard folder in the documented format (one shard), written independently of train/."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    np.asarray(ids, dtype=np.uint16).tofile(folder / "shard-00000.bin")
    (folder / "manifest.json").write_text(json.dumps({
        "format": "evalm-token-shards/1", "dtype": "uint16", "vocab_size": vocab_size, "eos_id": 256,
        "tokenizer": "bytes", "shards": [{"name": "shard-00000", "tokens": len(ids), "documents": 1}]}))


def test_references_bits_per_byte_and_fixed_positions_against_direct_computations(tmp_path):
    from evalm.icl_eval.perplexity.unigram import fit_unigram

    lm = tiny_evalm("eva", dtype=torch.float64)
    text = "the cat sat on the mat and the dog ate the bone " * 12
    train_ids = list(b"the the the cat mat dog bone and on sat ate " * 20)
    _write_shards(tmp_path / "shards", train_ids)
    unigram = fit_unigram(tmp_path / "shards", 257)
    counts = np.bincount(train_ids, minlength=257) + 1.0  # add-one, computed independently
    assert np.allclose(unigram, np.log(counts / counts.sum()))
    config = PerplexityConfig(max_tokens=600, segment_tokens=64, buckets=(256, 1024), baselines=(), fixed_contexts=(4, 32, 128),
                              fixed_target_tokens=16, fixed_targets_per_book=2)
    res = evaluate(lm, [("book", text)], config, unigram_logp=unigram)
    tokens = list(text.encode())[:600]
    ref = res["references"]
    assert ref["uniform"]["overall"]["token_ppl"] == pytest.approx(257)  # byte tokenizer: 256 bytes + eos
    expected_unigram = float(np.mean(-unigram[np.asarray(tokens)]))
    assert ref["unigram"]["overall"]["mean_nll"] == pytest.approx(expected_unigram)
    cached = res["protocols"]["cached"]["overall"]
    assert cached["bits_per_byte"] == pytest.approx(cached["mean_nll"] / np.log(2))  # ASCII: one byte per token
    rows = res["fixed_position"]["rows"]
    assert [r["context"] for r in rows] == [4, 32, 128] and res["fixed_position"]["protocol"]["targets"] == 2
    first = rows[0]["mean_nll"]
    for row in rows:  # oracle: one forward over context + targets, the last 16 tokens' NLL
        nll = []
        for s in (128, len(tokens) - 16):  # two spans: right after the longest context and at the book's end
            seq = tokens[s - row["context"]: s + 16]
            logits = lm.forward(torch.tensor([seq]))[0]
            lp = torch.log_softmax(logits[:-1].double(), -1)
            nll.append(-lp[torch.arange(len(seq) - 1), torch.tensor(seq[1:])][-16:].numpy())
        assert row["mean_nll"] == pytest.approx(float(np.mean(np.concatenate(nll))), abs=1e-9)
        delta = row["vs_shortest"]
        assert delta["delta_nll"] == pytest.approx(row["mean_nll"] - first, abs=1e-9)
        assert delta["delta_nll_ci95"][0] <= delta["delta_nll"] <= delta["delta_nll_ci95"][1]


def test_fixed_position_spans_spread_without_overlap_and_paired_interval():
    from evalm.icl_eval.stats.bootstrap import hierarchical_interval
    from evalm.icl_eval.perplexity.lengths import target_starts

    starts = target_starts(10_000, 4096, 128, 8)
    assert starts[0] == 4096 and starts[-1] == 10_000 - 128 and len(starts) == 8
    assert all(b - a >= 128 for a, b in zip(starts, starts[1:]))
    assert target_starts(4096 + 300, 4096, 128, 8) == [4096, 4096 + 172]  # room for two spans only
    assert target_starts(4000, 4096, 128, 8) == []
    rng = np.random.default_rng(3)
    deltas = rng.normal(-0.05, 0.02, size=40)
    lo, hi = hierarchical_interval([deltas], [range(len(deltas))])  # what fixed_position calls
    half = 1.96 * deltas.std(ddof=1) / np.sqrt(len(deltas))  # normal-theory interval, independent oracle
    assert lo == pytest.approx(deltas.mean() - half, abs=0.004) and hi == pytest.approx(deltas.mean() + half, abs=0.004)
    assert hi < 0
