"""The data stages on a real Ray cluster: a head started here on loopback.

    python -m pytest tests/data_pipeline/test_ray.py -m slow -q      (needs `pip install 'evalm[ray]'`)

The head is `ray start --head --block` in its own process group with its own temp dir, stopped
by killing that group (never `ray stop`, which would stop every Ray on the machine). Its workers
import this checkout through PYTHONPATH, inherited from the head.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from .chain import corpus, run_chain, tree

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def head():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "RAY_ADDRESS": ""}
    ray_bin = Path(sys.executable).with_name("ray")
    proc = subprocess.Popen([str(ray_bin), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
                             "--num-cpus=2", "--include-dashboard=false", f"--temp-dir={temp}", "--disable-usage-stats"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    address = f"127.0.0.1:{port}"
    for _ in range(120):
        probe = subprocess.run([str(ray_bin), "status", f"--address={address}"], capture_output=True, env=env)
        if probe.returncode == 0:
            break
        time.sleep(1)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the Ray head did not come up in 120 s")
    yield address
    os.killpg(proc.pid, signal.SIGTERM)  # the head and the raylet, GCS and workers it started
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def ray_args(address: str) -> list[str]:
    return ["--executor", "ray", "--executor-option", f"address={address}", "--executor-option", "mem_per_cpu_gb=0.25"]


def test_filter_dedup_blend_on_ray_are_byte_identical_to_local(tmp_path, head):
    inputs = corpus(tmp_path / "in")
    run_chain(inputs, tmp_path / "local", [])
    run_chain(inputs, tmp_path / "ray", ray_args(head))
    local, on_ray = tree(tmp_path / "local"), tree(tmp_path / "ray")
    assert local.keys() == on_ray.keys() and any(k.startswith("dedup/removed/") for k in local)
    for stage, step in (("filter", "filter"), ("dedup", "graph"), ("blend", "write")):
        assert "nodes_per_task" in json.loads((tmp_path / "ray" / stage / "logs" / step / "executor.json").read_text())  # Ray's own field
    for name in local:
        assert on_ray[name] == local[name], name


def test_a_killed_ray_job_reruns_from_datatroves_markers(tmp_path, head):
    """SIGKILL the driver (its Ray tasks die with it) once some tasks are done; the rerun only runs the rest."""
    inputs = corpus(tmp_path / "in", files=8, docs=150)
    base = [sys.executable, "-m", "evalm.data_pipeline.cli", "filter", "--input", str(inputs), "--tasks", "8"]
    subprocess.run(base + ["--output", str(tmp_path / "local")], check=True, capture_output=True)
    out = tmp_path / "ray"
    cmd = base + ["--output", str(out), *ray_args(head)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    markers = out / "logs" / "filter" / "completions"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (markers.is_dir() and any(markers.iterdir())):
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # our own driver's process group only
    proc.wait()
    done = {p.name: p.stat().st_mtime_ns for p in markers.iterdir()}
    assert 1 <= len(done) < 8, "the kill must land midway"
    assert not (out / "manifest.json").exists()
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert all((markers / n).stat().st_mtime_ns == t for n, t in done.items()), "completed tasks were rerun"
    assert tree(out) == tree(tmp_path / "local")
    assert "nodes_per_task" in json.loads((markers.parent / "executor.json").read_text())
