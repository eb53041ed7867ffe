"""filter -> dedup -> blend on a small corpus with a given executor, and a byte comparison of two chains.

Shared by the real-engine tests (Ray, Slurm): each runs the same three commands the local
executor runs and must produce the same bytes. Paths recorded in config.json / manifest.json
name each chain's own folders, so those two files are compared with the chain root replaced.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path

from .conftest import pile_line, write_shard
from .test_jobs import _text

SUBSETS = ["Pile-CC", "Wikipedia (en)", "Books3", "DM Mathematics"]
BUDGETS = 'unit = 1\nrelative = true\noverflow = "cap"\n[tokens]\n"Pile-CC" = 3\n"Wikipedia (en)" = 1\n"Books3" = 1\n"DM Mathematics" = 1\n'


def corpus(folder: Path, files: int = 4, docs: int = 60) -> Path:
    """Pile-format shards with near-duplicate pairs, so dedup removes something."""
    rng = random.Random(11)
    folder.mkdir(parents=True)
    for f in range(files):
        lines = []
        for _ in range(docs):
            text, subset = _text(rng, rng.randint(60, 300)), rng.choice(SUBSETS)
            lines.append(pile_line(text, subset))
            if rng.random() < 0.2:
                lines.append(pile_line(text + " again", subset))  # J > 0.95 with its original
        write_shard(folder / f"{f:03d}.jsonl.zst", lines)
    return folder


def run_chain(inputs: Path, root: Path, executor_args: list[str], env: dict | None = None, tasks: int = 2) -> None:
    """The three stages as the CLI runs them, into root/filter, root/dedup, root/blend."""
    budgets = root / "budgets.toml"
    root.mkdir(parents=True)
    budgets.write_text(BUDGETS)
    stages = [("filter", inputs, []), ("dedup", root / "filter", []), ("blend", root / "dedup", ["--budgets", budgets])]
    for stage, source, extra in stages:
        cmd = [sys.executable, "-m", "evalm.data_pipeline.cli", stage, "--input", str(source), "--output", str(root / stage),
               "--tasks", str(tasks), *map(str, extra), *executor_args]
        done = subprocess.run(cmd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{stage}: {done.stderr[-3000:]}"
        wait_for(root / stage / "manifest.json")  # Slurm returns once the jobs are submitted


def wait_for(path: Path, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            logs = sorted(path.parent.glob("logs/*/slurm_logs/*.out"))
            tails = "\n".join(f"{p}: {p.read_text()[-800:]}" for p in logs[-3:])
            raise AssertionError(f"{path} did not appear in {timeout} s\n{tails}")
        time.sleep(0.5)


def tree(root: Path) -> dict[str, bytes]:
    """Every output file but datatrove's logs and a launch's own bookkeeping (its lock record, its
    cache of input hashes), with the chain's own root path neutralised."""
    from evalm.storage.run_folder import BOOKKEEPING

    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if p.is_file() and "logs" not in rel.parts and p.name not in BOOKKEEPING:
            data = p.read_bytes()
            if p.suffix == ".json":
                data = data.replace(str(root).encode(), b"ROOT")
            out[str(rel)] = data
    return out
