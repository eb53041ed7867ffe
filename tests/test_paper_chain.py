"""The README's "Paper scale on a cluster" block, run as written.

    python -m pytest tests/test_paper_chain.py -m slow -q

The commands are read from README.md itself, so the test breaks when the README or a shipped
config stops chaining (e.g. configs/msit.toml naming a folder no command writes). Every output
path stays exactly as written; what changes is only what cannot exist here, each listed in EDITS:
the user's data (seeded CI-sized stand-ins: /data/pile, and a datasets cache holding nyu-mll/glue sst2 and
deepmind/pg19 in the hub layout, read offline as the README's evaluation commands do), cluster flags (8 GPUs -> 2 CPU ranks under
torchrun, Slurm -> the local executor, HOST -> a real local Redis, 300 tasks -> 2), the 120B-token
budget (-> the shipped relative Table 5, configs/budgets-tiny.toml), the GPT-2 tokenizer file
(-> "or train one") and evaluation sizes. The shipped 350M/MSIT configs shrink through `--set` only.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hub_cache import write_hub_cache
from tests.launcher.samples_fixture import write_samples
from tests.train.helpers import free_port

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
SHAPE = ["model.d_model=32", "model.n_layer=2", "model.n_head=2", "model.d_ff=64", "model.window_size=8",
         "model.chunk_size=4", "model.circular_period=64"]
RUN = ["train.steps=4", "train.batch_size=1", "train.grad_accum=1", "train.mixed_precision=fp32",
       "train.activation_checkpointing=false", "train.device=cpu", "train.log_every=1", "optim.warmup_steps=1",
       "checkpoint.save_every=2"]
SETS = {"evalm.train.pretrain": [*SHAPE, *RUN, "data.seq_len=64"], "evalm.train.msit": [*SHAPE, *RUN, "data.seq_len=128"]}
EDITS = [  # (pattern, replacement) applied to each command line of the block
    (r"--executor slurm|--executor-option \S+", ""),
    (r"--tasks \d+", "--tasks 2"),
    (r"--budgets data_pipeline/budgets/table5\.toml", "--budgets configs/budgets-tiny.toml"),
    (r"--tokenizer gpt2/tokenizer\.json", "--vocab-size 512"),
    (r"--nproc_per_node=8", "--nproc_per_node=2"),
    (r"--shots \S+", "--shots 0,2"), (r"--seeds \S+", "--seeds 1"), (r"--save-predictions", "--save-predictions --eval.test_items=4"),
    (r"--lengths \S+", "--lengths 64,128 --max-tokens 128 --ppl.segment_tokens=32 --ppl.max_books=1"),
]


def readme_block() -> list[str]:
    """The commands of the README's paper-scale block, continuation lines joined, comments dropped."""
    text = (REPO / "README.md").read_text()
    block = text.split("### Paper scale on a cluster", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    block = block.replace("\\\n", " ")
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]


def to_argv(line: str, work: Path, redis_url: str) -> list[str]:
    for pattern, repl in EDITS:
        line = re.sub(pattern, repl, line)
    line = line.replace("redis://HOST:6379/0", redis_url).replace(" /data/", f" {work}/data/")
    argv = shlex.split(line)
    if argv[0] == "evalm":
        return [sys.executable, "-m", "evalm.launcher.cli", *argv[1:]]
    assert argv[0] == "torchrun", line
    module = argv[argv.index("-m") + 1]
    sets = [x for s in SETS[module] for x in ("--set", s)]
    return [sys.executable, "-m", "torch.distributed.run", f"--master_port={free_port()}", *argv[1:], *sets]


def stand_in_data(work: Path) -> None:
    """/data/pile/train, runs/flan/train.jsonl, and the datasets cache the README's evaluation reads
    offline (nyu-mll/glue sst2, deepmind/pg19), CI-sized, in the hub cache's layout under HF_HOME."""
    samples = write_samples(work / "samples")
    (work / "data" / "pile").mkdir(parents=True)
    (samples / "pile").rename(work / "data" / "pile" / "train")
    splits = {}
    for split, hub_split in (("train", "train"), ("test", "validation")):  # GLUE's labelled split is validation
        rows = [json.loads(x) for x in (samples / "tasks" / "polarity" / f"{split}.jsonl").read_text().splitlines()]
        splits[hub_split] = {"sentence": [r["text"] for r in rows], "label": [r["label"] for r in rows],
                             "idx": list(range(len(rows)))}
    write_hub_cache(work, "nyu-mll/glue", "sst2", splits)
    books = sorted((samples / "books").glob("*.txt"))
    write_hub_cache(work, "deepmind/pg19", None, {"test": {
        "short_book_title": [b.stem for b in books], "publication_date": [1900] * len(books),
        "url": [f"local://{b.name}" for b in books], "text": [b.read_text() for b in books]}})
    (work / "runs" / "flan").mkdir(parents=True)
    (samples / "instructions" / "train.jsonl").rename(work / "runs" / "flan" / "train.jsonl")


def test_the_readme_paper_scale_chain_runs_as_written(tmp_path, redis_url):
    work = tmp_path / "work"
    work.mkdir()
    (work / "configs").symlink_to(REPO / "configs")
    stand_in_data(work)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    lines = readme_block()
    assert len(lines) == 11, lines
    logs = {}
    for line in lines:
        done = subprocess.run(to_argv(line, work, redis_url), cwd=work, env=env, capture_output=True, text=True,
                              timeout=900)
        assert done.returncode == 0, f"{line}\n{done.stderr[-3000:]}"
        logs[line] = done.stdout + done.stderr
    for path in ("out/filter", "out/dedup", "out/blend", "out/tokens"):
        assert (work / path / "manifest.json").is_file(), path
    for run in ("runs/350m", "runs/350m-msit", "runs/350m-msit+"):
        assert (work / run / "checkpoints" / "step-00000004" / ".complete").is_file(), run
    msit = [text for line, text in logs.items() if "configs/msit" in line]
    assert len(msit) == 2 and all("initialised the model from runs/350m/checkpoints/step-00000004" in t for t in msit)
    assert (work / "models" / "350m-msit" / "model.safetensors").is_file()
    assert list((work / "results" / "sst2").rglob("*.json")) and list((work / "results" / "pg19").rglob("*.json"))
    sst2 = json.loads((work / "results" / "sst2" / "results.json").read_text())
    assert "nyu-mll/glue" in json.dumps(sst2["protocol"]["data"])  # read from the offline cache, not a folder
