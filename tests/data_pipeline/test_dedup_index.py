"""The compact Redis band index finds exactly the candidate pairs of datasketch's in-memory index.

Random signatures with planted shared bands (one band for most pairs, three for some), at a size
where the band digests are split over 2^k hashes with k > 0, so the key/field split is exercised;
the oracle is datasketch's MinHashLSH with the same 8 x 16 bands. On a real Redis (EVALM_REDIS_URL
or a private server, see tests/conftest.py); only this test's namespace is touched.

Run: python -m pytest tests/data_pipeline/test_dedup_index.py -q
"""

from __future__ import annotations

import numpy as np
import pytest

from evalm.data_pipeline import dedup_index, lsh
from evalm.data_pipeline.minhash import lean

BANDS, ROWS, DOCS = 8, 16, 3000


def _signatures(popular: int = 0) -> np.ndarray:
    """Random signatures, planted pairs, and `popular` documents sharing band 2 with document 0."""
    rng = np.random.default_rng(4)
    sigs = rng.integers(0, 2**32, (DOCS, 128), dtype=np.uint64).astype(np.uint32)
    sigs[DOCS - popular:, 2 * ROWS:3 * ROWS] = sigs[0, 2 * ROWS:3 * ROWS]
    for shared in [1] * 200 + [3] * 50:  # pairs agreeing on 1 or 3 bands and nothing else
        i, j = rng.choice(DOCS, 2, replace=False)
        for b in rng.choice(BANDS, shared, replace=False):
            sigs[j, b * ROWS:(b + 1) * ROWS] = sigs[i, b * ROWS:(b + 1) * ROWS]
    return sigs


def _oracle(sigs: np.ndarray) -> set[tuple[int, int]]:
    index = lsh.make_index(128, BANDS, ROWS)
    pairs = set()
    for me, sig in enumerate(sigs):
        m = lean(sig, 1)
        pairs.update((other, me) for other in index.query(m))
        index.insert(me, m, check_duplication=False)
    return pairs


def _index_and_query(tmp_path, redis_url, sigs: np.ndarray) -> set[tuple[int, int]]:
    namespace = lsh.basename_for(tmp_path)
    index = dedup_index.BandIndex(dedup_index.open_servers(redis_url, BANDS), namespace, BANDS, ROWS, DOCS)
    try:
        index.insert(0, 0, sigs)
        return {p for p in index.query(0, sigs) if p[0] < p[1]}
    finally:
        assert dedup_index.drop(redis_url, namespace, BANDS) > 0


@pytest.mark.redis
def test_a_popular_bucket_past_one_hscan_reply_is_read_whole(tmp_path, redis_url, monkeypatch):
    """600 documents share one band value: their hash leaves Redis' listpack encoding (512 fields)
    and, with HSCAN's COUNT at 10, needs more than one reply; the HKEYS fallback keeps every pair."""
    monkeypatch.setattr(dedup_index, "SCAN_COUNT", 10)
    sigs = _signatures(popular=600)
    expected = _oracle(sigs)
    assert len(expected) > 150_000  # ~600 choose 2 (a few planted pairs overwrite band 2)
    assert _index_and_query(tmp_path, redis_url, sigs) == expected


@pytest.mark.redis
def test_band_hashes_give_datasketchs_candidates(tmp_path, redis_url):
    sigs = _signatures()
    namespace = lsh.basename_for(tmp_path)
    assert dedup_index.bucket_bits(DOCS) == 6  # 64 hashes per band, 47 fields each on average
    index = dedup_index.BandIndex(dedup_index.open_servers(redis_url, BANDS), namespace, BANDS, ROWS, DOCS)
    try:
        half = DOCS // 2
        index.insert(0, 0, sigs[:half])
        index.insert(1, half, sigs[half:])
        assert index.missing_inserts(2) == [] and index.missing_inserts(3) == [2]
        found = {p for first, part in ((0, sigs[:half]), (half, sigs[half:]))
                 for p in index.query(first, part) if p[0] < p[1]}
        expected = _oracle(sigs)
        assert len(expected) >= 240 and found == expected
    finally:
        assert dedup_index.drop(redis_url, namespace, BANDS) > 0
