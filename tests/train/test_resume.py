"""Exact resume on real process groups: 2 gloo ranks, SIGKILL, `--resume auto`.

    python -m pytest tests/train/test_resume.py -q

Every run is `train.pretrain.main` in two processes spawned here with a free port, the way torchrun
starts them (RANK, WORLD_SIZE, MASTER_ADDR/PORT). Losses are compared with `==` and parameters
with `torch.equal`: on CPU with gloo every reduction has a fixed order, so a correct resume is
bit-identical and any lost state (data cursor, dropout RNG, optimizer moments) shows up.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.train.helpers import free_port, tiny_run_file, write_shards
from evalm.train import checkpoint

N_STEPS = 6


def _worker(rank: int, world: int, port: int, argv: list[str], kill_after_save: int, kill_in_save: int) -> None:
    """One rank of a torchrun-like launch; optionally SIGKILLs itself after or in the middle of a save."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    save, finish = checkpoint.save, checkpoint._finish

    def save_then_maybe_die(out, step, *args):
        path = save(out, step, *args)
        if step == kill_after_save:
            os.kill(os.getpid(), signal.SIGKILL)  # the checkpoint is complete on every rank
        return path

    def finish_or_die(tmp, final, config_json):
        if final.name == f"step-{kill_in_save:08d}":
            os.kill(os.getpid(), signal.SIGKILL)  # DCP files written, no config, no marker, no rename
        finish(tmp, final, config_json)

    checkpoint.save, checkpoint._finish = save_then_maybe_die, finish_or_die
    from evalm.train.pretrain import main

    assert main(argv) == 0


def launch(argv: list[str], *, kill_after_save: int = -1, kill_in_save: int = -1, worker=_worker) -> bool:
    """Run 2 ranks (`worker`, as `_worker`) to completion; True when they ran through, False when killed by SIGKILL."""
    try:
        mp.spawn(worker, args=(2, free_port(), argv, kill_after_save, kill_in_save), nprocs=2, join=True)
        return True
    except mp.ProcessExitedException as err:
        assert err.exit_code == -signal.SIGKILL, f"a rank failed: {err}"
        return False
    except mp.ProcessRaisedException as err:  # the other rank sees its peer vanish mid-collective
        assert "Connection" in str(err) or "gloo" in str(err).lower(), err
        return False


def losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


def final_params(out: Path) -> dict[str, torch.Tensor]:
    """The model of the last checkpoint, gathered into one process (a 2-rank DCP loads anywhere)."""
    import torch.distributed.checkpoint as dcp

    from evalm import EvalmModel, ModelConfig

    saved = json.loads((checkpoint.complete_checkpoints(out)[-1] / "config.json").read_text())
    model = EvalmModel(ModelConfig(**saved["model"]))
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=str(checkpoint.complete_checkpoints(out)[-1]), planner=checkpoint.SafeLoadPlanner())
    return state["model"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    write_shards(root / "tokens")
    run_file = tiny_run_file(root / "run.toml", root / "tokens", steps=N_STEPS, save_every=2)
    reference = root / "reference"
    assert launch(["--config", str(run_file), "--out", str(reference)])
    return run_file, reference


def _assert_same_tail(reference: Path, resumed: Path, first: int) -> None:
    ref, got = losses(reference), losses(resumed)
    assert sorted(got) == list(range(1, N_STEPS + 1))
    for step in range(first, N_STEPS + 1):
        assert got[step] == ref[step], f"step {step}: {got[step]!r} != {ref[step]!r}"
    a, b = final_params(reference), final_params(resumed)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_sigkill_after_checkpoint_then_resume_is_bit_identical(setup, tmp_path):
    run_file, reference = setup
    out = tmp_path / "run"
    assert not launch(["--config", str(run_file), "--out", str(out)], kill_after_save=4)
    assert [p.name for p in checkpoint.complete_checkpoints(out)] == ["step-00000002", "step-00000004"]
    assert launch(["--config", str(run_file), "--out", str(out), "--resume", "auto"])
    _assert_same_tail(reference, out, first=5)
    assert losses(out)[3] == losses(reference)[3]  # steps before the kill were logged by the same run


@pytest.mark.slow  # ~11 s on 2 cores; a truncated latest checkpoint (tests/hostile/test_checkpoints.py) stays in CI
def test_save_killed_midway_leaves_previous_checkpoint(setup, tmp_path):
    run_file, reference = setup
    out = tmp_path / "run"
    assert not launch(["--config", str(run_file), "--out", str(out)], kill_in_save=4)
    assert (out / "checkpoints" / ".tmp-step-00000004").is_dir()  # the killed save's debris
    assert checkpoint.find_resume_path(out, "auto").name == "step-00000002"
    assert launch(["--config", str(run_file), "--out", str(out), "--resume", "auto"])
    _assert_same_tail(reference, out, first=3)
    assert not (out / "checkpoints" / ".tmp-step-00000004").exists()


@pytest.mark.slow  # ~7 s on 2 cores; the spawned ranks' resume stays in CI
def test_torchrun_launch_matches_the_spawned_ranks(setup, tmp_path):
    """The real launcher: `torchrun --nproc_per_node=2 -m evalm.train.pretrain` is the same entry point."""
    import subprocess
    import sys

    run_file, reference = setup
    out = tmp_path / "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           "-m", "evalm.train.pretrain", "--config", str(run_file), "--out", str(out), "--set", "train.steps=2",
           "--set", "optim.warmup_steps=2"]
    done = subprocess.run(cmd, env=env, cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    # warm-up covers both steps, so their LR equals the 6-step reference's and so must the losses
    assert losses(out) == {s: losses(reference)[s] for s in (1, 2)}
