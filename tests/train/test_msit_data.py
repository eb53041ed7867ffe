"""`evalm train msit-data` run alone, as a user runs it: a real `evalm` process writing a real file.

    python -m pytest tests/train/test_msit_data.py -q
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from evalm.text.synthetic import LABEL_LETTERS, LETTERS, SyntheticConfig, instruction_examples

REPO = Path(__file__).resolve().parents[2]


def evalm(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evalm.launcher.cli", *argv], capture_output=True, text=True, cwd=REPO)


def test_rows_are_the_generators_episodes_then_the_instruction_rows(tmp_path):
    instructions = tmp_path / "inst.jsonl"
    real = [{"task": f"t{i % 2}", "input": f"question {i}", "output": f"answer {i}"} for i in range(5)]
    instructions.write_text("".join(json.dumps(r) + "\n" for r in real))
    out = tmp_path / "deep" / "train.jsonl"
    proc = evalm("train", "msit-data", "--out", str(out), "--episodes", "6", "--examples", "30", "--inputs", "2,4,8",
                 "--seed", "7", "--instructions", str(instructions), "--instructions-limit", "3")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[:180] == instruction_examples(SyntheticConfig(), 6, 30, seed=7, inputs_per_episode=(2, 4, 8))
    assert rows[180:] == real[:3]
    # independently of the generator: one rule per episode, its size cycling through --inputs
    episodes: dict[str, list[dict]] = defaultdict(list)
    for row in rows[:180]:
        episodes[row["task"]].append(row)
    assert sorted(episodes) == [f"synthetic-{k:05d}" for k in range(6)]
    for k, (task, items) in enumerate(sorted(episodes.items())):
        size = (2, 4, 8)[k % 3]
        rule = {row["input"]: row["output"] for row in items}
        assert len(items) == 30 and set(rule) <= set(LETTERS[:size]), task
        assert len({(r["input"], r["output"]) for r in items}) == len(rule)  # an input keeps its label
        assert set(rule.values()) <= set(LABEL_LETTERS[:4])
    assert "180 synthetic rows" in proc.stdout and "3 instruction rows" in proc.stdout


def test_a_bad_flag_or_file_is_one_line_without_a_traceback(tmp_path, capsys):
    from evalm.train.msit_data import main

    bad_row = tmp_path / "bad.jsonl"
    bad_row.write_text('{"task": "a", "input": "x", "output": "y"}\nnot json\n')
    cases = {("--inputs", "2,40"): "--inputs", ("--inputs", "two"): "--inputs",
             ("--episodes", "0"): "nothing to write", ("--instructions", str(tmp_path / "none.jsonl")): "no such file",
             ("--instructions", str(bad_row)): "bad.jsonl:2", ("--examples", "0"): "--examples"}
    for flags, expected in cases.items():
        assert main(["--out", str(tmp_path / "o.jsonl"), *flags]) == 2, flags
        err = capsys.readouterr().err
        assert err.startswith("evalm train msit-data: error:") and expected in err, err
        assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o.jsonl").exists()
