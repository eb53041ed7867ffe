"""Resume on another world size and another global batch, on real gloo process groups.

    python -m pytest tests/train/test_resume_world.py -q

Each rank appends every line id it reads to OUT/lines-rank<r>.txt (the source's `line` is wrapped
in the spawned worker: the record is of what training actually read). Two uninterrupted references
of 6 steps with checkpoints every 2: 2 ranks x 2 lines x 2 micro-steps, and 1 rank x 2 x 4: both a
global batch of 8 lines. A run resumed from step 2 of one on the other world size must
- with the same global batch: log the reference's losses (to float noise: the reductions differ);
- with any batch: read exactly the lines that follow the checkpoint's prefix, so the lines of the
  first 2 steps plus the resumed run's are the uninterrupted order's first N, none twice.
Attention is exact and dropout 0: with them the loss is a function of the lines alone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.train.helpers import free_port, tiny_run_file, write_shards

N_STEPS = 6
EXACT = ["--set", "model.dropout=0.0", "--set", "model.attn_dropout=0.0"]


def _worker(rank: int, world: int, port: int, argv: list[str], record: str) -> None:
    """One rank, torchrun-style, recording the ids of the lines it reads."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    from evalm.train.shards import PretrainLines

    read = PretrainLines.line

    def line(self, i):
        with open(f"{record}/lines-rank{rank}.txt", "a") as f:
            f.write(f"{i}\n")
        return read(self, i)

    PretrainLines.line = line
    from evalm.train.pretrain import main

    assert main(argv) == 0


def launch(world: int, run_file: Path, out: Path, *sets: str, resume: str = "none") -> None:
    out.mkdir(parents=True)
    argv = ["--config", str(run_file), "--out", str(out), "--resume", resume, *EXACT]
    for item in sets:
        argv += ["--set", item]
    mp.spawn(_worker, args=(world, free_port(), argv, str(out)), nprocs=world, join=True)


def read_ids(out: Path, rank: int) -> list[int]:
    return [int(x) for x in (out / f"lines-rank{rank}.txt").read_text().split()]


def losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}


@pytest.fixture(scope="module")
def refs(tmp_path_factory):
    """The two uninterrupted references: 2 ranks x grad_accum 2, and 1 rank x grad_accum 4."""
    root = tmp_path_factory.mktemp("world")
    write_shards(root / "tokens", n_docs=80)
    run_file = tiny_run_file(root / "run.toml", root / "tokens", steps=N_STEPS, save_every=2, attention="full")
    launch(2, run_file, root / "ref2")
    launch(1, run_file, root / "ref1", "train.grad_accum=4")
    return run_file, root


def test_the_references_agree(refs):
    """Same global batch on 1 or 2 ranks: the same lines per step, so the same losses."""
    _, root = refs
    order = read_ids(root / "ref1", 0)  # one rank reads the global order itself
    assert len(order) == len(set(order)) == N_STEPS * 8
    assert sorted(read_ids(root / "ref2", 0) + read_ids(root / "ref2", 1)) == sorted(order)
    assert losses(root / "ref1") == pytest.approx(losses(root / "ref2"), rel=1e-5)


CASES = {  # name: (reference, new world, its --set, global batch after resume)
    "2to1-same-batch": ("ref2", 1, ["train.grad_accum=4"], 8),
    "1to2-same-batch": ("ref1", 2, [], 8),
    "2to1-half-batch": ("ref2", 1, [], 4),
    "1to2-half-batch": ("ref1", 2, ["train.grad_accum=1"], 4),
}


@pytest.mark.parametrize("case", [c if c in ("2to1-same-batch", "1to2-half-batch") else  # the others: slow, ~6 s each
                                  pytest.param(c, marks=pytest.mark.slow) for c in CASES])
def test_resume_on_another_world_size(refs, tmp_path, case):
    run_file, root = refs
    ref_name, world, sets, global_batch = CASES[case]
    ref = root / ref_name
    launch(world, run_file, tmp_path / "run", *sets, resume=str(ref / "checkpoints" / "step-00000002"))
    ref_world = 2 if ref_name == "ref2" else 1
    per_rank_before = 2 * 8 // ref_world  # lines each reference rank read in steps 1-2
    consumed = [i for r in range(ref_world) for i in read_ids(ref, r)[:per_rank_before]]
    consumed += [i for r in range(world) for i in read_ids(tmp_path / "run", r)]
    order = read_ids(root / "ref1", 0)
    assert len(consumed) == 16 + (N_STEPS - 2) * global_batch
    assert len(consumed) == len(set(consumed)), "a line was read twice"
    assert sorted(consumed) == sorted(order[: len(consumed)]), "lines skipped or out of the prefix"
    got = losses(tmp_path / "run")
    assert sorted(got) == list(range(3, N_STEPS + 1))
    if global_batch == 8:
        want = losses(ref)
        for step in got:
            assert got[step] == pytest.approx(want[step], rel=1e-5), step
