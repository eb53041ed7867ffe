"""The stage table of `evalm run` is built from the command table `evalm` dispatches; no import loops.

    python -m pytest tests/launcher/test_stages.py -q
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from evalm.text.synthetic import SyntheticConfig, instruction_examples
from evalm.launcher import cli
from evalm.launcher.keys import stage_key
from evalm.launcher.run_file import load_run
from evalm.launcher.stages import STAGES, stage_commands

REPO = Path(__file__).resolve().parents[2]


def _run_file(tmp_path: Path) -> Path:
    (tmp_path / "samples" / "instructions").mkdir(parents=True)
    rows = [{"task": "qa", "input": f"q{i}", "output": f"a{i}"} for i in range(6)]
    (tmp_path / "samples" / "instructions" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "run.toml"
    path.write_text(f'[run]\nroot = "{tmp_path / "runs"}"\nsamples = "{tmp_path / "samples"}"\n'
                    "[msit]\nsynthetic_episodes = 5\nsynthetic_examples = 12\nsynthetic_inputs = [2, 8]\n"
                    "sample_instructions = 4\n"
                    '[[eval]]\nname = "synthetic"\n')
    return path


def test_every_stage_is_a_command_of_the_evalm_table(tmp_path):
    from evalm.data_pipeline.cli import COMMANDS as DATA
    from evalm.icl_eval.cli import COMMANDS as EVAL
    from evalm.train.cli import COMMANDS as TRAIN

    nested = {"data": DATA, "train": TRAIN, "eval": EVAL}
    r = load_run(_run_file(tmp_path))
    for stage in STAGES:
        for argv in stage_commands(r, stage):
            assert argv[0] in cli.COMMANDS and argv[0] != "run", (stage, argv)
            assert argv[0] not in nested or argv[1] in nested[argv[0]], (stage, argv)
            assert all(isinstance(a, str) for a in argv), argv


def test_the_msit_stage_writes_its_rows_with_evalm_train_msit_data(tmp_path, capsys):
    """The stage's first command, run alone, writes the run file's synthetic episodes (rule seed
    10**6, far from evaluation seeds) and then the samples' first instruction rows; the second
    command tunes on that file."""
    r = load_run(_run_file(tmp_path))
    data, tune = stage_commands(r, "msit")
    assert data[:2] == ["train", "msit-data"] and tune[:2] == ["train", "msit"]
    out = Path(data[data.index("--out") + 1])
    assert f"data.train_file={out}" in tune and out == r.stage_dir("msit") / "data" / "train.jsonl"
    key = stage_key(r, "msit", [data, tune], previous="")
    assert cli.main(data) == 0
    assert stage_key(r, "msit", [data, tune], previous="") == key  # its own output is not an input: reruns skip it
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    samples = (r.samples / "instructions" / "train.jsonl").read_text().splitlines()
    assert rows == [*instruction_examples(SyntheticConfig(), 5, 12, seed=10**6, inputs_per_episode=[2, 8]),
                    *map(json.loads, samples[:4])]


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
    return names


def test_no_import_loop_through_the_launcher():
    """Following every import (function-level ones included) from a launcher module never leads back to it."""
    files = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
             for pkg in ("evalm", "data_pipeline", "train", "icl_eval", "launcher") for p in (REPO / pkg).rglob("*.py")}
    graph = {m: {d for d in _imports(p) if d in files and d != m} for m, p in files.items()}
    for start in (m for m in files if m.startswith("launcher")):
        seen, todo = set(), list(graph[start])
        while todo:
            m = todo.pop()
            assert m != start, f"{start} imports itself back through {sorted(seen)}"
            if m not in seen:
                seen.add(m)
                todo.extend(graph[m])


def test_the_recall_stage_reads_at_multiples_of_the_training_length(tmp_path):
    """Lengths come from the pretrain config with the run's own sets (not a tiny constant), so a run
    training on 512-token lines reads at 512, 2,048 and 8,192; the tiny run at 1,024 ... 16,384.
    The run's one recall line states each model's accuracy per length from its results.json."""
    from evalm.launcher.report import recall_line

    path = _run_file(tmp_path)
    path.write_text(path.read_text() + '[pretrain]\nconfig = "configs/pretrain-tiny.toml"\nset = ["data.seq_len=512"]\n'
                    '[recall]\nmodels = ["pretrain", "full-pretrain"]\nargs = ["--items", "1"]\n')
    r = load_run(path)
    commands = stage_commands(r, "recall")
    assert [c[c.index("--checkpoint") + 1] for c in commands] == [str(r.stage_dir("export") / m)
                                                                 for m in ("pretrain", "full-pretrain")]
    assert {c[c.index("--lengths") + 1] for c in commands} == {"512,2048,8192"}
    assert all(c[:2] == ["eval", "recall"] and c[-2:] == ["--items", "1"] for c in commands)
    tiny = load_run(REPO / "configs" / "tiny.toml")
    assert {c[c.index("--lengths") + 1] for c in stage_commands(tiny, "recall")} == {"1024,4096,16384"}

    def cells(*accs):
        return {"cells": [{"task": "passkey", "length": n, "depth": d, "accuracy": a, "chance": 2e-5}
                          for n, pair in zip((512, 2048), accs) for d, a in zip((0, 100), pair)]}

    assert recall_line({"pretrain": cells((1, 0), (0, 0)), "full-pretrain": cells((1, 1), (0.5, 0))}) == \
        "passkey at 512 / 2,048 tokens: pretrain 0.50 / 0.00; full-pretrain 1.00 / 0.25 (chance 2e-05)"
