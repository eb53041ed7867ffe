"""The LSH index on a real 3-node Redis Cluster (and on a list of standalone servers).

Each test that needs a cluster starts its own (data_pipeline/dedup_cluster.py): three
`redis-server --cluster-enabled yes` processes on free loopback ports, working folders under
tmp_path, joined by `redis-cli --cluster create`, every process SIGKILLed by pid at teardown.
The oracle is the in-memory datasketch index: the same corpus must give byte-identical survivors,
removals and graph files, whichever Redis holds the index.

Run: python -m pytest tests/data_pipeline/test_cluster_dedup.py -q
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess

import numpy as np
import pytest

from evalm.data_pipeline import dedup_cluster
from evalm.data_pipeline.dedup_index import band_tag, drop
from evalm.data_pipeline.lsh import basename_for

from .conftest import pile_line, write_shard
from .test_dedup import _check, _planted
from .test_jobs import _tree
from .test_redis_hygiene import _launch_until_first_insert, _relaunch_matches_memory

redis = pytest.importorskip("redis")
PARTS = ("documents", "removed", "graph")


@pytest.fixture
def cluster(tmp_path):
    """A 3-master Redis Cluster this test owns; skipped without redis-server/redis-cli, failed under CI."""
    if dedup_cluster.binaries() is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server/redis-cli are not installed; .ci/run must install Debian's redis-server")
        pytest.skip("redis-server and redis-cli not on PATH (apt-get install redis-server)")
    with dedup_cluster.LocalCluster(tmp_path / "cluster", nodes=3) as c:
        yield c


def _tags_per_node(cluster) -> list[set[bytes]]:
    """The hash tags of the keys each node holds."""
    out = []
    for i in range(len(cluster.ports)):
        keys = cluster.client(i).keys(b"evalm:*")
        out.append({k[k.index(b"{") + 1: k.index(b"}")] for k in keys})
    return out


def test_three_node_cluster_gives_the_survivors_of_memory_and_single_server(tmp_path, run_cli, redis_url, cluster):
    folder, truth = _planted(tmp_path)
    out = tmp_path / "out"  # apart from tmp_path/cluster, the live cluster's own files (--overwrite must not touch them)
    runs = {"memory": [], "server": ["--redis-url", redis_url], "cluster": ["--redis-url", cluster.url, "--keep-index"]}
    for name, extra in runs.items():
        assert run_cli("dedup", "--input", folder, "--output", out / name, "--tasks", 3, *extra) == 0
        _check(out / name, truth)
    for name in ("server", "cluster"):
        for part in PARTS:
            assert _tree(out / name / part) == _tree(out / "memory" / part), (name, part)
    # each band's keys on one node (its hash tag), the 8 bands spread 3/3/2 over the 3 nodes
    tags = _tags_per_node(cluster)
    bands = {band_tag(b, 8) for b in range(8)}
    assert set().union(*tags) == bands
    assert sorted(len(t) for t in tags) == [2, 3, 3] and not (tags[0] & tags[1] or tags[1] & tags[2] or tags[0] & tags[2])
    index = json.loads((out / "cluster" / "manifest.json").read_text())["redis"]
    assert len(index["nodes"]) == 3 and all(n["keys"] > 0 and n["bytes"] > 0 for n in index["nodes"].values())
    # the compact encoding; datasketch's spent about 4,000 B a document (benchmarks/dedup_memory.py)
    assert 0 < index["index_bytes_per_document"] < 2000
    # a fresh launch without --keep-index: same files, and the run's keys are gone from every node
    assert run_cli("dedup", "--input", folder, "--output", out / "cluster", "--tasks", 3, "--redis-url",
                   cluster.url, "--overwrite") == 0
    assert _tree(out / "cluster" / "documents") == _tree(out / "memory" / "documents")
    assert all(not cluster.client(i).keys(b"*") for i in range(3))


def test_a_list_of_servers_holds_band_b_on_server_b_mod_n(tmp_path, run_cli, redis_url):
    """Two databases of one server as two servers: band b's keys only in database b mod 2."""
    base = redis_url.rsplit("/", 1)[0]
    urls = [f"{base}/14", f"{base}/15"]
    folder, truth = _planted(tmp_path)
    assert run_cli("dedup", "--input", folder, "--output", tmp_path / "memory", "--tasks", 2) == 0
    assert run_cli("dedup", "--input", folder, "--output", tmp_path / "list", "--tasks", 2, "--redis-url",
                   ",".join(urls), "--keep-index") == 0
    for part in PARTS:
        assert _tree(tmp_path / "list" / part) == _tree(tmp_path / "memory" / part), part
    namespace = basename_for(tmp_path / "list")
    for db, u in enumerate(urls):  # only this run's keys: the databases may hold others'
        keys = redis.Redis.from_url(u).keys(namespace + b"*")
        assert {k[k.index(b"{") + 1: k.index(b"}")] for k in keys} == {band_tag(b, 8) for b in range(db, 8, 2)}
    assert drop(",".join(urls), namespace, 8) > 0


def _graded(folder, bases: int = 40) -> None:
    """8 shards of documents near a base at J = 0.97, 0.90, 0.85, 0.80: pairs that LSH finds on
    8, ~2, ~1 or 0-1 bands, so a band lost on one node changes the candidates, not only a survivor."""
    rng = random.Random(3)
    lines = []
    for b in range(bases):
        base = [f"t{b}-{i}" for i in range(300)]
        lines.append(pile_line(" ".join(base), "Pile-CC", id=f"b{b}"))
        for j in (0.97, 0.90, 0.85, 0.80):
            d = round(300 * (1 - j) / (1 + j))  # d swapped tokens: J = (300 - d) / (300 + d)
            drop = set(rng.sample(range(300), d))
            tokens = [t for i, t in enumerate(base) if i not in drop] + [f"v{b}-{j}-{i}" for i in range(d)]
            lines.append(pile_line(" ".join(tokens), "Pile-CC", id=f"b{b}-{j}"))
    rng.shuffle(lines)
    folder.mkdir(parents=True)
    for f in range(8):
        write_shard(folder / f"{f:02d}.jsonl.zst", lines[f::8])


def _candidates(out) -> set[tuple[int, int]]:
    return {tuple(p) for f in sorted((out / "candidates").glob("*.npy")) for p in np.load(f).tolist()}


def _rerun_matches_memory(tmp_path, cmd) -> None:
    """Byte-identical survivors, removals and graph; the same candidate pairs as the memory index."""
    _relaunch_matches_memory(tmp_path, cmd)
    assert len(_candidates(tmp_path / "memory")) > 100
    assert _candidates(tmp_path / "out") == _candidates(tmp_path / "memory")


@pytest.mark.slow  # ~33 s on 2 cores; the three-node cluster's survivors stay in CI
def test_a_node_killed_mid_insert_is_one_clear_line_and_the_rerun_is_byte_identical(tmp_path, cluster):
    _graded(tmp_path / "in")
    cmd, proc = _launch_until_first_insert(tmp_path, cluster.url, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           text=True)
    cluster.kill_node(0)  # its 3 bands' buckets are gone; the running job's next command to it fails
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err[-2000:]
    line = [x for x in err.splitlines() if x.startswith("evalm data dedup: error")][-1]
    assert cluster.url in line and "relaunch the same command" in line
    cluster.start_node(0)  # same ports and nodes.conf: it rejoins with its slots, empty
    cluster.wait_ok()
    _rerun_matches_memory(tmp_path, cmd)
    assert all(not cluster.client(i).keys(b"*") for i in range(3))


# ~35 s on 2 cores; the single-server restart tests (tests/data_pipeline/test_redis_hygiene.py) keep the relaunch
# repair in CI
@pytest.mark.slow
def test_a_node_restarted_between_launches_is_repaired_by_the_relaunch(tmp_path, cluster):
    """The job dies after some insert tasks; a node restarts empty; the relaunch sees that node's
    bands lack those tasks (marks live beside the buckets, with the node's run_id) and redoes them."""
    _graded(tmp_path / "in")
    cmd, proc = _launch_until_first_insert(tmp_path, cluster.url, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL, start_new_session=True)
    os.killpg(proc.pid, signal.SIGKILL)  # our own child's process group only
    proc.wait()
    cluster.restart_node(2)
    _rerun_matches_memory(tmp_path, cmd)


def _error_line(run_cli, capsys, tmp_path, url: str) -> str:
    folder = tmp_path / "in"
    if not folder.exists():
        _planted(tmp_path)
    assert run_cli("dedup", "--input", folder, "--output", tmp_path / "out", "--redis-url", url, "--overwrite") == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("evalm data dedup: error") and url in lines[0], err
    return lines[0]


def test_a_bad_cluster_url_or_a_node_down_is_one_clear_line(tmp_path, run_cli, capsys, redis_url, cluster):
    free = dedup_cluster.free_ports(1)[0]
    assert "'127.0.0.1:x' is not HOST:PORT" in _error_line(run_cli, capsys, tmp_path, "redis+cluster://127.0.0.1:x")
    assert "no cluster answered" in _error_line(run_cli, capsys, tmp_path, f"redis+cluster://127.0.0.1:{free}")
    host_port = redis_url.split("//")[1].rsplit("/", 1)[0]  # a standalone server is not a cluster
    assert "no cluster answered" in _error_line(run_cli, capsys, tmp_path, f"redis+cluster://{host_port}")
    assert "unknown scheme 'redis+shards://'" in _error_line(run_cli, capsys, tmp_path, "redis+shards://h:1")
    cluster.kill_node(2)
    line = _error_line(run_cli, capsys, tmp_path, cluster.url)
    assert f"127.0.0.1:{cluster.ports[2]}" in line and "relaunch the same command" in line
