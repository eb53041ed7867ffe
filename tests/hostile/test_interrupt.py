"""Ctrl-C reaching one rank of two ends both between the same steps (train.interrupt): a rank that
stopped alone would leave the other waiting in its next collective until the 30-minute timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.hostile.conftest import REPO, wait_for
from tests.train.helpers import free_port, tiny_run_file, write_shards


def test_ctrl_c_on_one_rank_stops_both_ranks_after_the_same_step(tmp_path):
    write_shards(tmp_path / "tokens")
    run_file = tiny_run_file(tmp_path / "run.toml", tmp_path / "tokens", steps=100_000, save_every=3)
    out, port = tmp_path / "out", free_port()
    ranks = []
    for rank in range(2):
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank)}
        ranks.append(subprocess.Popen([sys.executable, "-m", "evalm.launcher.cli", "train", "pretrain", "--config",
                                       str(run_file), "--out", str(out)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    try:
        wait_for(lambda: list(out.glob("checkpoints/step-*")) or any(p.poll() is not None for p in ranks), 240)
        assert all(p.poll() is None for p in ranks), [p.communicate() for p in ranks]
        ranks[1].send_signal(signal.SIGINT)  # only rank 1 hears it
        results = [p.communicate(timeout=90) for p in ranks]
    finally:
        for p in ranks:
            p.kill()
    assert [p.returncode for p in ranks] == [130, 130], results
    assert "resume with: evalm train pretrain" in results[0][1]
    assert "Traceback" not in results[0][1] + results[1][1]
