"""Our fingerprints equal datasketch's own MinHash for the same tokens and seed.

Run: python -m pytest tests/data_pipeline/test_minhash.py -q
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from datasketch import LeanMinHash, MinHash

from data_pipeline import lsh
from data_pipeline.minhash import Fingerprinter, lean_bytes, token_set


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
    # DATA_SPEC §4 numbers for b=8, r=16
    assert lsh.candidate_probability(0.95, 8, 16) == pytest.approx(0.990, abs=1e-3)
    assert lsh.candidate_probability(0.90, 8, 16) == pytest.approx(0.81, abs=0.01)
    assert lsh.candidate_probability(0.95, 3, 42) == pytest.approx(0.31, abs=0.01)
