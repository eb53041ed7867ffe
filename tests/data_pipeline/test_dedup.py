"""A planted near-duplicate corpus collapses to one document per true cluster, no false merge,
with the in-memory index and with a real Redis alike.

Each cluster is a base set A of 400 distinct tokens plus variants that drop d tokens of A and add
d fresh ones, so J(variant, A) = (400 - d) / (400 + d): d = 2, 5, 10 give 0.990, 0.975, 0.951
(above 0.95: merged); near misses d = 11, 14 give 0.946, 0.932 (below: kept apart). Variants drop
disjoint tokens, so any two variants are further apart than each is from A.

Run: python -m pytest tests/data_pipeline/test_dedup.py -q
"""

from __future__ import annotations

import random
import socket
import time

import pytest

from .conftest import pile_line, read_records, write_shard

MERGED_D = (2, 5, 10)
APART_D = (11, 14)
CLUSTERS = 12


def _planted(tmp_path):
    rng = random.Random(5)
    fresh = (f"w{i}" for i in range(10**7))
    lines, truth = [], {}
    for c in range(CLUSTERS):
        base = [next(fresh) for _ in range(400)]
        drops = rng.sample(range(400), sum(MERGED_D) + sum(APART_D))
        docs = [(f"c{c}-base", base, "Pile-CC")]
        for k, d in enumerate(MERGED_D + APART_D):
            drop = set(drops[:d])
            drops = drops[d:]
            tokens = [t for i, t in enumerate(base) if i not in drop] + [next(fresh) for _ in range(d)]
            # one merged variant lives in Wikipedia: by priority it must be the survivor
            subset = "Wikipedia (en)" if k == 1 else "Pile-CC"
            docs.append((f"c{c}-d{d}", tokens, subset))
        for doc_id, tokens, subset in docs:
            rng.shuffle(tokens)
            lines.append(pile_line(" ".join(tokens), subset, id=doc_id))
            truth[doc_id] = f"c{c}" if doc_id.endswith(("base",) + tuple(f"-d{d}" for d in MERGED_D)) else doc_id
    rng.shuffle(lines)
    folder = tmp_path / "in"
    folder.mkdir()
    for i in range(3):
        write_shard(folder / f"{i:02d}.jsonl.zst", lines[i::3])
    return folder, truth


def _check(out, truth):
    kept = read_records(out / "documents")
    removed = read_records(out / "removed")
    assert len(kept) + len(removed) == len(truth)
    kept_clusters = [truth[r["id"]] for r in kept]
    assert sorted(kept_clusters) == sorted(set(truth.values())), "one survivor per true cluster"
    for c in range(CLUSTERS):  # priority: the Wikipedia variant survives its cluster
        assert f"c{c}-d{MERGED_D[1]}" in {r["id"] for r in kept}
    for r in removed:
        assert truth[r["id"]] == truth[r["dedup_survivor"]], "no false merge"
        assert isinstance(r["dedup_component"], int)
    return {r["id"] for r in kept}


def test_planted_clusters_memory_index(tmp_path, run_cli):
    folder, truth = _planted(tmp_path)
    assert run_cli("dedup", "--input", folder, "--output", tmp_path / "out", "--tasks", 2) == 0
    _check(tmp_path / "out", truth)
    import json

    graph = json.loads((tmp_path / "out" / "manifest.json").read_text())["graph"]
    assert graph["components_with_duplicates"] == CLUSTERS
    assert graph["verified_edges"] >= CLUSTERS * len(MERGED_D)


@pytest.mark.redis
def test_planted_clusters_redis_index_matches_memory(tmp_path, run_cli, redis_url):
    import redis

    folder, truth = _planted(tmp_path)
    assert run_cli("dedup", "--input", folder, "--output", tmp_path / "mem", "--tasks", 2) == 0
    assert run_cli("dedup", "--input", folder, "--output", tmp_path / "red", "--tasks", 2, "--redis-url", redis_url) == 0
    assert _check(tmp_path / "red", truth) == _check(tmp_path / "mem", truth)
    # the run's keys lived under its namespace and were deleted at completion
    import json

    namespace = json.loads((tmp_path / "red" / "manifest.json").read_text())["redis"]["namespace"]
    assert namespace.startswith("evalm:")
    assert not redis.Redis.from_url(redis_url).keys(namespace + "*")


def test_unreachable_redis_fails_fast_with_url_and_advice(tmp_path, run_cli, capsys):
    folder, _ = _planted(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"redis://127.0.0.1:{port}/0"
    start = time.monotonic()
    assert run_cli("dedup", "--input", folder, "--output", tmp_path / "out", "--redis-url", url) == 2
    assert time.monotonic() - start < 10
    err = capsys.readouterr().err
    assert url in err and "redis-server" in err and "--redis-url" in err


def test_verification_is_sharded_over_tasks(tmp_path, run_cli):
    """tokens/verify run as 3 tasks: each hashes only its own documents that are in a pair, each
    verifies a third of the pairs, and together they give the graph its edges."""
    import json

    import numpy as np

    from evalm.data_pipeline.fingerprint_store import offsets
    from evalm.data_pipeline.dedup_verify import jaccard, token_hashes

    folder, truth = _planted(tmp_path)
    out = tmp_path / "out"
    assert run_cli("dedup", "--input", folder, "--output", out, "--tasks", 3) == 0
    _check(out, truth)
    pairs = np.concatenate([np.load(f) for f in sorted((out / "candidates").glob("*.npy"))])
    in_pairs = set(pairs.ravel().tolist())
    bounds = offsets(out, 3)
    edges = []
    for r in range(3):
        index = np.load(out / "tokens" / f"{r:05d}.index.npy")
        assert set(index[:, 0].tolist()) == {d for d in in_pairs if bounds[r] <= d < bounds[r + 1]}
        mine = np.load(out / "edges" / f"{r:05d}.npy")
        assert set(map(tuple, mine.tolist())) <= set(map(tuple, pairs[len(pairs) * r // 3: len(pairs) * (r + 1) // 3].tolist()))
        edges += mine.tolist()
    assert len(edges) == json.loads((out / "graph" / "stats.json").read_text())["verified_edges"] > 0
    # hashed Jaccard equals the string-set Jaccard
    a, b = "x y z w v", "x y z w q"
    assert jaccard(token_hashes(a), token_hashes(b)) == 4 / 6 and jaccard(token_hashes(""), token_hashes("")) == 1.0
