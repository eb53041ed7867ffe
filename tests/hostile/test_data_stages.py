"""Data stages as a hostile input meets them: an input rewritten under its old name, a failing
task's traceback, a Redis database the server does not have."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.hostile.conftest import REPO, one_line

GOOD = b'{"text": "%s", "meta": {"pile_set_name": "Pile-CC"}}\n'


def _stage(*argv: str, debug: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("EVALM_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "evalm.launcher.cli", *(["--debug"] if debug else []), "data",
                           *argv], capture_output=True, text=True, env=env, timeout=300)


def run_cli(*argv) -> int:
    from evalm.data_pipeline.cli import main

    return main([str(a) for a in argv])


def test_an_input_changed_under_its_name_is_not_reported_done(tmp_path, capsys):
    shard = tmp_path / "in" / "a.jsonl"
    shard.parent.mkdir()
    words = " ".join(f"w{i}" for i in range(80))
    shard.write_bytes(GOOD % words.encode())
    out = tmp_path / "out"
    assert run_cli("filter", "--input", shard.parent, "--output", out) == 0
    assert run_cli("filter", "--input", shard.parent, "--output", out) == 0  # unchanged: a relaunch is fine
    shard.write_bytes(GOOD % words.replace("w1", "x1").encode())  # same name, same size, other bytes
    capsys.readouterr()
    assert run_cli("filter", "--input", shard.parent, "--output", out) == 2
    line = one_line(capsys.readouterr().err)
    assert "input_sha256.a.jsonl: recorded 'sha256:" in line and "--input (the same file contents)" in line
    assert run_cli("filter", "--input", shard.parent, "--output", out, "--overwrite") == 0


@pytest.mark.parametrize("workers", [1, 2])  # 2: the tasks run in worker processes writing to fd 2 themselves
def test_a_failing_task_is_one_line_and_its_traceback_is_in_the_task_log(tmp_path, workers):
    (tmp_path / "in").mkdir()
    for i in range(2):
        (tmp_path / "in" / f"{i}.jsonl").write_bytes(GOOD % b"hello world" + b"not json\n" * 3)
    done = _stage("filter", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--tasks", "2",
                  "--workers", str(workers))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "3 bad records out of 4" in done.stderr.strip().splitlines()[-1]
    logs = list((tmp_path / "out" / "logs").rglob("task_*.log"))
    assert any("Traceback (most recent call last)" in p.read_text() for p in logs)
    debug = _stage("filter", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--tasks", "2",
                   debug=True)
    assert debug.returncode != 0 and "Traceback (most recent call last)" in debug.stderr


@pytest.mark.redis
def test_a_redis_database_out_of_range_is_one_line(tmp_path, redis_url):
    shard = tmp_path / "in" / "a.jsonl"
    shard.parent.mkdir()
    shard.write_bytes(GOOD % b"hello world")
    url = redis_url.rsplit("/", 1)[0] + "/999"
    done = _stage("dedup", "--input", str(shard.parent), "--output", str(tmp_path / "out"), "--redis-url", url)
    line = one_line(done.stderr)
    assert done.returncode == 2 and f"Redis at {url} refused the connection: DB index is out of range" in line
