"""The data stages on a real single-node Slurm (Debian's slurm-wlm + munge) on loopback.

    apt-get install slurm-wlm munge
    python -m pytest tests/data_pipeline/test_slurm.py -m slow -q

`scripts/slurm_local.sh` starts munged, slurmctld and slurmd as this user with everything under a
temporary folder, and stops exactly those pids. datatrove submits each step as a job array
(`srun launch_pickled_pipeline ...`) chained by `afterok` dependencies; the test waits for each
stage's manifest.json and compares every output byte with the local executor's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .chain import corpus, run_chain, tree

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm_local.sh"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if not (shutil.which("slurmctld") and shutil.which("munged")):
        pytest.skip("slurm-wlm and munge are not installed (apt-get install slurm-wlm munge)")
    state = tmp_path_factory.mktemp("slurm")
    started = subprocess.run([str(SCRIPT), "start", str(state)], capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    # the jobs run launch_pickled_pipeline (this venv's bin) on this checkout (PYTHONPATH): sbatch exports both
    env = {"SLURM_CONF": str(state / "slurm.conf"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    yield env
    subprocess.run([str(SCRIPT), "stop", str(state)], check=True, timeout=60)


def test_filter_dedup_blend_on_slurm_are_byte_identical_to_local(tmp_path, slurm):
    inputs = corpus(tmp_path / "in")
    run_chain(inputs, tmp_path / "local", [])
    options = ["partition=debug", "time=00:30:00", "mem_per_cpu_gb=1"]
    run_chain(inputs, tmp_path / "slurm", ["--executor", "slurm", *(x for o in options for x in ("--executor-option", o))],
              env=slurm)
    local, on_slurm = tree(tmp_path / "local"), tree(tmp_path / "slurm")
    assert local.keys() == on_slurm.keys() and any(k.startswith("dedup/removed/") for k in local)
    for name in local:
        assert on_slurm[name] == local[name], name
    for stage, step in (("filter", "filter"), ("dedup", "graph"), ("blend", "write")):
        logs = tmp_path / "slurm" / stage / "logs" / step
        assert json.loads((logs / "executor.json").read_text())["partition"] == "debug"
        assert list((logs / "slurm_logs").glob("*.out")), "the step ran as a Slurm job"
