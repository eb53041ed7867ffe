"""Wall time of `python -m evalm.icl_eval icl|ppl` on N ranks against one process, on the same grid.

    python benchmarks/eval_ranks.py [--ranks 2] [--seeds 1,2,3,4] [--shots 0,16,32,64] [--items 32] [--books 8]
                                    [--out runs/bench-eval-ranks]

An exported two-layer byte-level EVALM (untrained: time does not depend on the weights), a
two-label task file and random-word books are written under --out; each command runs once as
one process and once as N gloo ranks (processes started as torchrun would, RANK/WORLD_SIZE/...,
OMP_NUM_THREADS=1 in every process so both arms use one thread per rank). Wall time is from the
first process's start to the last one's end, model loading and the merge included. The two
results.json files are checked equal (timings and the `execution` block aside) before any figure
is printed. On a machine with fewer free cores than ranks the ratio says so, not the code.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import timing
from evalm.data_pipeline.dedup_cluster import free_ports
from evalm.icl_eval.protocol.units import without_execution

REPO = Path(__file__).resolve().parents[1]


def _inputs(root: Path, items: int, n_books: int) -> tuple[Path, Path, Path]:
    """(exported model, task file, books folder) under `root`."""
    from evalm.icl_eval.tasks.folder import write_task_folder
    from evalm.icl_eval.tasks.task import Task
    from evalm.io import save_model

    folder = save_model(timing.random_model(circular_period=4096), root / "model")
    rng = random.Random(0)
    rows = [{"text": " ".join(rng.choice(("good", "bad", "fine", "dull", "fun")) for _ in range(8)), "label": i % 2}
            for i in range(64 + items)]
    task, _ = write_task_folder(root / "task", Task("bench", "{text} {label}", ("no", "yes")),
                                {"train": rows[:64], "test": rows[64:]})
    books = root / "books"
    books.mkdir(exist_ok=True)
    for b in range(n_books):
        words = ("".join(rng.choice("abcdefgh") for _ in range(rng.randint(1, 7))) for _ in range(2000))
        (books / f"book{b}.txt").write_text(" ".join(words))
    return folder, task, books


def timed(argv: list[str], world: int) -> float:
    """Seconds of wall time of `python -m evalm.icl_eval ARGV` on `world` ranks."""
    port, procs = free_ports(1)[0], []
    t0 = time.perf_counter()
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
        if world > 1:
            env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                       LOCAL_RANK=str(rank))
        procs.append(subprocess.Popen([sys.executable, "-m", "evalm.icl_eval", *argv], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    errors = [p.communicate()[1] for p in procs]
    seconds = time.perf_counter() - t0
    if any(p.returncode for p in procs):
        raise SystemExit(f"`python -m evalm.icl_eval {' '.join(argv)}` failed on {world} rank(s):\n{errors}")
    return seconds


def main(ranks: int = 2, seeds: str = "1,2,3,4", shots: str = "0,16,32,64", items: int = 32, books: int = 8,
         out: str = "runs/bench-eval-ranks") -> None:
    """`books` of ~9,000 byte tokens scored to 8,192; `out` the working folder."""
    print(timing.machine())
    root = Path(out)
    model, task, folder = _inputs(root, items, books)
    commands = {
        "icl": ["icl", "--checkpoint", str(model), "--task", str(task), "--methods", "incremental,concat",
                "--shots", shots, "--seeds", seeds],
        "ppl": ["ppl", "--checkpoint", str(model), "--books", str(folder), "--lengths", "1024,8192"],
    }
    print(f"{'command':>8} {'units':>6} {'1 rank s':>9} {f'{ranks} ranks s':>10} {'ratio':>6}")
    for name, command in commands.items():
        one, many = root / f"{name}-1", root / f"{name}-{ranks}"
        t1 = timed([*command, "--out", str(one), "--overwrite"], 1)
        tn = timed([*command, "--out", str(many), "--overwrite"], ranks)
        a, b = (json.loads((d / "results.json").read_text()) for d in (one, many))
        if without_execution(a) != without_execution(b):
            raise SystemExit(f"{name}: results.json of {ranks} ranks differs from one process")
        print(f"{name:>8} {a['execution']['units']:>6} {t1:>9.1f} {tn:>10.1f} {timing.ratio(t1, tn):>6}")
    print("(wall time per command, process start to end; results.json equal)")


if __name__ == "__main__":
    raise SystemExit(timing.cli(main, __doc__))
