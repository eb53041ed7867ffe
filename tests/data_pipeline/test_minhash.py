"""Our fingerprints equal datasketch's own MinHash for the same tokens and seed.

Run: python -m pytest tests/data_pipeline/test_minhash.py -q
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from datasketch import LeanMinHash, MinHash

from evalm.data_pipeline import lsh
from evalm.data_pipeline.minhash import Fingerprinter, lean_bytes, token_set


def _corpus(n: int, seed: int) -> list[set[str]]:
    rng = random.Random(seed)
    vocab = [f"tok{i}" for i in range(3000)] + ["caf\u00e9", "x", "", "  "]
    return [set(rng.choices(vocab, k=rng.randint(1, 400))) for _ in range(n)] + [set()]


@pytest.mark.parametrize(("num_perm", "seed"), [(128, 1), (64, 7)])
def test_signatures_equal_datasketch(num_perm, seed):
    sets = _corpus(200, seed)
    ours = Fingerprinter(num_perm=num_perm, seed=seed).signatures(sets)
    for s, sig in zip(sets, ours):
        ref = MinHash(num_perm=num_perm, seed=seed)
        ref.update_batch([t.encode("utf-8") for t in s])
        np.testing.assert_array_equal(sig, ref.hashvalues)


def test_signatures_equal_bulk_with_a_tiny_cache():
    # max_vocab far below the vocabulary: the cache restarts many times and must stay exact
    sets = _corpus(100, 3)
    ours = Fingerprinter(max_vocab=50).signatures(sets)
    ref = MinHash.bulk([[t.encode() for t in s] for s in sets], num_perm=128, seed=1)
    np.testing.assert_array_equal(ours, np.stack([m.hashvalues for m in ref]))


def test_token_set_is_whitespace_1grams():
    assert token_set("a b\nb\tc  a") == {"a", "b", "c"}


def test_lean_bytes_are_datasketch_format():
    sig = Fingerprinter().signatures([{"a", "b", "c"}])[0]
    back = LeanMinHash.deserialize(lean_bytes(sig, 1))
    assert back.scheme == "affine32" and back.seed == 1
    np.testing.assert_array_equal(back.hashvalues, sig)


def test_band_choice_finds_095_pairs():
    # docs/data_pipeline.md numbers for b=8, r=16
    assert lsh.candidate_probability(0.95, 8, 16) == pytest.approx(0.990, abs=1e-3)
    assert lsh.candidate_probability(0.90, 8, 16) == pytest.approx(0.81, abs=0.01)
    assert lsh.candidate_probability(0.95, 3, 42) == pytest.approx(0.31, abs=0.01)


def _datasketch(docs, num_perm=128, seed=1) -> np.ndarray:
    # datasketch itself, one MinHash per document (update_batch hashes every token, repeats included)
    out = []
    for doc in docs:
        m = MinHash(num_perm=num_perm, seed=seed)
        m.update_batch([t.encode("utf-8") for t in doc])
        out.append(m.hashvalues)
    return np.stack(out)


@pytest.mark.parametrize("max_vocab", [1 << 20, 3])
def test_cached_hashes_match_datasketch_across_calls(max_vocab):
    # documents as lists with repeated words, empty documents between them, one-token documents,
    # a document repeated (all rows cached), and a second call mixing cached and unseen tokens
    rng = random.Random(5)
    vocab = [f"w{i}" for i in range(500)] + ["caf\u00e9", "\u00e9t\u00e9", "a\x00b"]
    first = [[], ["the", "the", "the"], rng.choices(vocab[:50], k=300), [], ["x"], ["x"]]
    first.append(first[2])
    second = [rng.choices(vocab, k=rng.randint(0, 60)) for _ in range(40)] + [["the"] * 5 + ["new"] * 2, []]
    fp = Fingerprinter(max_vocab=max_vocab)
    np.testing.assert_array_equal(fp.signatures(first), _datasketch(first))
    np.testing.assert_array_equal(fp.signatures(second), _datasketch(second))
    np.testing.assert_array_equal(fp.signatures(first + second), _datasketch(first + second))


def test_no_documents_and_only_empty_documents():
    assert Fingerprinter().signatures([]).shape == (0, 128)
    np.testing.assert_array_equal(Fingerprinter().signatures([[], set()]), _datasketch([[], []]))
