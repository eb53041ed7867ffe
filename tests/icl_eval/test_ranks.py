"""`python -m evalm.icl_eval icl|ppl` on 2 real gloo ranks against the same command in one process.

Every rank is its own process, started with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT as torchrun
would; OMP_NUM_THREADS=1 in every process (one rank or two), so a unit's floats do not depend on
how many threads a process got and the files can be compared exactly. What may differ is listed
in `evalm.icl_eval.protocol.units.EXECUTION`: how long things took and how the run was executed (ranks, units resumed).

Run: python -m pytest tests/icl_eval/test_ranks.py -q
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from evalm.icl_eval.protocol.units import without_execution
from tests import models
from tests.train.helpers import free_port

REPO = Path(__file__).resolve().parents[2]
GRID = ["--methods", "incremental,concat", "--budgets", "0,40,80", "--seeds", "1,2", "--order", "random,label-sorted",
        "--order-seeds", "1,2", "--nearest", "remove", "--nearest-k", "1", "--save-predictions",
        "--eval.choose_shot_on_validation=true", "--eval.validation_items=4"]
"""2 draw seeds x test and validation x 3 token budgets: 12 units, so each of 2 ranks scores 6 and a kill
lands between units; each unit with two orders, two order seeds and a nearest-demonstration arm."""


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory) -> Path:
    """An exported one-layer EVALM over bytes (vocab 257): eval commands load it instead of training one."""
    return models.byte_model(tmp_path_factory.mktemp("byte-model") / "model")


@pytest.fixture(scope="module")
def two_label_task(tmp_path_factory) -> Path:
    """A task file with 16 train and 6 test rows of two labels."""
    return models.two_label_task(tmp_path_factory.mktemp("task"), n_train=16, n_test=6)


@pytest.fixture(scope="module")
def books(tmp_path_factory) -> Path:
    """Five books of random words, of different lengths (so ranks get unequal work)."""
    folder = tmp_path_factory.mktemp("books")
    rng = random.Random(0)
    for b in range(5):
        words = ("".join(rng.choice("abcdefgh") for _ in range(rng.randint(1, 7))) for _ in range(100 + 40 * b))
        (folder / f"book{b}.txt").write_text(" ".join(words))
    return folder


def launch(args: list[str], world: int) -> list[subprocess.Popen]:
    """`python -m evalm.icl_eval ARGS` as `world` ranks (one plain process when world is 1)."""
    port, procs = free_port(), []
    for rank in range(world):
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(name, None)
        if world > 1:
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                       LOCAL_RANK=str(rank))
        procs.append(subprocess.Popen([sys.executable, "-m", "evalm.icl_eval", *args], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    return procs


def run(args: list[str], world: int) -> list[tuple[str, str]]:
    procs = launch(args, world)
    try:
        outs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0] * world, outs
    return outs


def results(out: Path) -> dict:
    return without_execution(json.loads((out / "results.json").read_text()))


def icl_args(model: Path, task: Path, out: Path, *extra: str) -> list[str]:
    return ["icl", "--checkpoint", str(model), "--task", str(task), *GRID, "--out", str(out), *extra]


@pytest.fixture(scope="module")
def icl_one_process(byte_model, two_label_task, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("icl-one") / "out"
    run(icl_args(byte_model, two_label_task, out), 1)
    return out


def rank_units(out: Path) -> list[int]:
    """Units each rank computed in its last run (its progress file)."""
    files = sorted((out / "units" / "progress").glob("rank-*.json"))
    return [json.loads(f.read_text())["units"] for f in files]


def test_icl_on_two_ranks_writes_the_one_process_results(byte_model, two_label_task, icl_one_process, tmp_path):
    out = tmp_path / "out"
    (stdout, stderr), _ = run(icl_args(byte_model, two_label_task, out), 2)
    assert rank_units(out) == [6, 6]  # the 12 units were split between the ranks
    one = results(icl_one_process)
    assert results(out) == one
    # seeds x splits x methods x budgets (2 orders x 2 order seeds, + remove-nearest in each order seed past budget 0)
    assert len(one["records"]) == 2 * 2 * 2 * (4 + 6 + 6)
    assert (out / "predictions.jsonl").read_text() == (icl_one_process / "predictions.jsonl").read_text()
    execution = json.loads((out / "results.json").read_text())["execution"]
    assert execution == {"ranks": 2, "units": 12, "units_resumed": 0, "units_computed": 12}
    assert "evalm eval icl: units 12/12 (0 resumed)" in stderr and "items/s" in stderr


@pytest.mark.slow  # ~10 s on 2 cores; two-rank ICL stays in CI
def test_ppl_on_two_ranks_writes_the_one_process_results(byte_model, books, tmp_path):
    args = ["ppl", "--checkpoint", str(byte_model), "--books", str(books), "--lengths", "64,256",
            "--fixed-contexts", "8,32"]
    run([*args, "--out", str(tmp_path / "one")], 1)
    run([*args, "--out", str(tmp_path / "two")], 2)
    assert rank_units(tmp_path / "two") == [3, 2]
    one = results(tmp_path / "one")
    assert results(tmp_path / "two") == one
    assert [b["book"] for b in one["books"]] == [f"book{b}.txt" for b in range(5)]  # book order, not rank order
    assert one["fixed_position"]["protocol"]["targets"] > 0


@pytest.mark.slow  # ~14 s on 2 cores; two-rank ICL stays in CI
def test_a_killed_rank_reruns_to_the_same_results_without_redoing_finished_units(
        byte_model, two_label_task, icl_one_process, tmp_path):
    out = tmp_path / "out"
    args = icl_args(byte_model, two_label_task, out)
    procs = launch(args, 2)
    try:
        deadline = time.monotonic() + 240
        while len(list((out / "units").glob("0*.npz"))) < 2:
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            assert time.monotonic() < deadline, "no unit finished"
            time.sleep(0.02)
        procs[1].send_signal(signal.SIGKILL)  # one rank dies mid-run; torchrun would then stop the other
        procs[0].send_signal(signal.SIGKILL)
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    kept = {f.name: (f.stat().st_ino, f.stat().st_mtime_ns) for f in (out / "units").glob("0*.npz")}
    assert 2 <= len(kept) < 12, kept
    assert not (out / "results.json").exists()

    (_, stderr), _ = run(args, 2)
    assert not list((out / "units").glob("*.tmp*"))  # a unit half-written at the kill was never taken as finished
    assert results(out) == results(icl_one_process)
    execution = json.loads((out / "results.json").read_text())["execution"]
    assert execution["units_resumed"] == len(kept) and execution["units_computed"] == 12 - len(kept)
    assert sum(rank_units(out)) == 12 - len(kept)
    for name, stamp in kept.items():  # the finished units were read, not written again
        f = out / "units" / name
        assert (f.stat().st_ino, f.stat().st_mtime_ns) == stamp
    assert f"({len(kept)} resumed)" in stderr


def test_a_changed_setting_is_refused_naming_it_unless_overwrite(byte_model, two_label_task, tmp_path):
    from evalm.icl_eval.cli import main

    out = tmp_path / "out"
    small = ["icl", "--checkpoint", str(byte_model), "--task", str(two_label_task), "--methods", "concat",
             "--seeds", "1", "--out", str(out)]
    assert main([*small, "--shots", "0,2"]) == 0
    units = sorted(p.name for p in (out / "units").glob("0*.npz"))
    proc = subprocess.run([sys.executable, "-m", "evalm.icl_eval", *small, "--shots", "0,4"], text=True,
                          capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2
    line = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1]
    assert "Traceback" not in proc.stderr
    assert "eval.shots: recorded [0, 2], now [0, 4]" in line and "--overwrite" in line, line
    assert sorted(p.name for p in (out / "units").glob("0*.npz")) == units  # nothing mixed in
    assert main([*small, "--shots", "0,4", "--overwrite"]) == 0
    assert json.loads((out / "results.json").read_text())["summary"]["test"]["concat"].keys() == {"0", "4"}


def test_a_folder_held_by_another_run_refuses_both_ranks(byte_model, two_label_task, tmp_path):
    """Only rank 0 takes the folder's lock (two ranks of one run share it); when another run holds it,
    rank 0's refusal reaches rank 1 too, which would otherwise wait for rank 0 forever."""
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom evalm.storage import folder_lock\n"
                               "with folder_lock(sys.argv[1], 'test holder'):\n    print('held', flush=True)\n"
                               "    time.sleep(600)", str(out)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "held"
        procs = launch(icl_args(byte_model, two_label_task, out), 2)
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        holder.kill()
        holder.wait()
    assert [p.returncode for p in procs] == [2, 2], outs
    for _, stderr in outs:
        assert "in use by" in stderr and "test holder" in stderr and "Traceback" not in stderr
    assert not (out / "units").exists()
