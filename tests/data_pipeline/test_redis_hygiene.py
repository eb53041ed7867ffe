"""Redis hygiene of the dedup index on a real redis-server.

Each test starts its own server (by pid, on a free loopback port, no persistence): one is killed
and restarted in the middle of a run, which empties it, as a crashed production server without
persistence would.

Run: python -m pytest tests/data_pipeline/test_redis_hygiene.py -q
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from .test_jobs import _corpus, _tree

redis = pytest.importorskip("redis")


class Server:
    """A redis-server process this test owns; `restart` kills it and starts an empty one on the same port."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen([shutil.which("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        for _ in range(200):
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def restart(self) -> None:
        self.kill()
        self.start()

    def client(self):
        return redis.Redis(port=self.port)


@pytest.fixture
def server():
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not on PATH (apt-get install redis-server)")
    s = Server()
    yield s
    s.kill()


def _dedup(*args) -> list[str]:
    return [sys.executable, "-m", "evalm.data_pipeline.cli", "dedup", *map(str, args)]


def test_keys_live_under_the_printed_namespace_and_go_at_completion(tmp_path, run_cli, server, capsys):
    _corpus(tmp_path / "in", 3, 40)
    out = tmp_path / "out"
    client = server.client()
    client.set(b"someone-else", b"1")  # another user's key in the same database
    assert run_cli("dedup", "--input", tmp_path / "in", "--output", out, "--tasks", 3, "--redis-url", server.url,
                   "--keep-index") == 0
    namespace = json.loads((out / "manifest.json").read_text())["redis"]["namespace"]
    assert f"Redis keys under {namespace}*" in capsys.readouterr().out
    kept = set(client.keys(b"*")) - {b"someone-else"}
    assert kept and all(k.startswith(namespace.encode()) for k in kept), "every index key is in the namespace"
    # a fresh launch (--overwrite) clears what was left, then the completed run deletes its keys
    client.sadd(namespace.encode() + b"_bucket_stale", b"999999")
    assert run_cli("dedup", "--input", tmp_path / "in", "--output", out, "--tasks", 3, "--redis-url", server.url,
                   "--overwrite") == 0
    assert set(client.keys(b"*")) == {b"someone-else"}
    manifest = json.loads((out / "manifest.json").read_text())["redis"]
    assert manifest["namespace"] == namespace and not manifest["index_kept"] and manifest["keys_removed"] > 0
    assert run_cli("dedup", "--input", tmp_path / "in", "--output", tmp_path / "memory", "--tasks", 3) == 0
    assert _tree(out / "documents") == _tree(tmp_path / "memory" / "documents")


ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def _launch_until_first_insert(tmp_path, url: str, **popen) -> tuple[list[str], subprocess.Popen]:
    """The memory-index reference on the corpus in tmp_path/in, then a launch on the index at `url`
    (one server, a list, or a cluster) that has just completed insert task 0."""
    subprocess.run(_dedup("--input", tmp_path / "in", "--output", tmp_path / "memory", "--tasks", 8), check=True,
                   env=ENV, capture_output=True)
    cmd = _dedup("--input", tmp_path / "in", "--output", tmp_path / "out", "--tasks", 8, "--redis-url", url)
    proc = subprocess.Popen(cmd, env=ENV, **popen)
    marker = tmp_path / "out" / "logs" / "lsh_insert" / "completions" / "00000"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not marker.exists():
        time.sleep(0.005)
    return cmd, proc


def _relaunch_matches_memory(tmp_path, cmd: list[str]) -> None:
    done = subprocess.run(cmd, env=ENV, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    for part in ("documents", "removed", "graph"):
        assert _tree(tmp_path / "out" / part) == _tree(tmp_path / "memory" / part), part


@pytest.mark.slow  # ~25 s on 2 cores
def test_a_redis_restart_mid_run_is_a_clear_error_and_the_rerun_has_the_same_survivors(tmp_path, server):
    _corpus(tmp_path / "in", 8, 150, seed=7)
    cmd, proc = _launch_until_first_insert(tmp_path, server.url, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           text=True)
    server.restart()  # the buckets of the tasks inserted so far are gone
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, err[-2000:]
    line = [x for x in err.splitlines() if x.startswith("evalm data dedup: error")][-1]
    assert server.url in line and "relaunch the same command" in line
    assert not (tmp_path / "out" / "manifest.json").exists()
    _relaunch_matches_memory(tmp_path, cmd)
    assert not server.client().keys(b"*")


@pytest.mark.slow  # ~20 s on 2 cores
def test_a_redis_restart_between_launches_is_repaired_by_the_relaunch(tmp_path, server):
    """The dedup process dies after some insert tasks completed, then Redis restarts empty: the
    relaunch unmarks the inserts whose buckets are gone before running, and completes."""
    _corpus(tmp_path / "in", 8, 150, seed=7)
    cmd, proc = _launch_until_first_insert(tmp_path, server.url, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL, start_new_session=True)
    os.killpg(proc.pid, signal.SIGKILL)  # our own child's process group only
    proc.wait()
    server.restart()
    assert not (tmp_path / "out" / "manifest.json").exists()
    _relaunch_matches_memory(tmp_path, cmd)
