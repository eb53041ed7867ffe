"""`evalm run` end to end on a CI-sized config: every stage's outputs, the report, skipping, --from.

    python -m pytest tests/launcher/test_run.py -q

The samples are written by the test (no network); the stages are the real commands.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.run import MARKER, STAGES, main
from tests.launcher.samples_fixture import write_samples

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    samples = write_samples(tmp / "samples")
    path = tmp / "ci.toml"
    path.write_text(f"""
[run]
name = "ci"
root = "{tmp / 'runs'}"
samples = "{samples}"
workers = 1
data_tasks = 1

[data]
blend = ["--budgets", "{REPO / 'configs' / 'budgets-tiny.toml'}"]

[tokenizer]
vocab_size = 300

[pretrain]
config = "{REPO / 'configs' / 'pretrain-tiny.toml'}"
set = ["model.attn_dropout=0.0", "train.steps=3", "train.batch_size=2", "data.seq_len=64",
       "checkpoint.save_every=3", "train.log_every=1"]

[msit]
config = "{REPO / 'configs' / 'msit-tiny.toml'}"
synthetic_episodes = 8
synthetic_examples = 20
sample_instructions = 10
set = ["model.attn_dropout=0.0", "train.steps=2", "train.batch_size=2", "data.seq_len=64",
       "checkpoint.save_every=2", "train.log_every=1", "data.default_template=[\\"{{input}}\\", \\" {{output}}\\"]"]

[[eval]]
name = "synthetic"
task = "synthetic"
args = ["--shots", "1,4", "--seeds", "1", "--methods", "incremental,concat", "--eval.separator=eos",
        "--eval.max_test_items=6", "--synthetic.template={{x}} {{label}}"]

[[eval]]
name = "polarity"
task = "tasks/polarity/task.toml"
args = ["--shots", "0,2", "--seeds", "1", "--methods", "incremental,structured", "--eval.max_test_items=4",
        "--eval.method.group_tokens=256"]

[ppl]
args = ["--lengths", "64,256", "--max-tokens", "256", "--ppl.segment_tokens=64", "--ppl.max_books=1"]
""")
    return path


def markers(run_dir: Path) -> dict[str, float]:
    return {stage: (run_dir / stage / MARKER).stat().st_mtime_ns for stage in STAGES}


def test_every_stage_runs_and_writes_its_outputs(run_file):
    assert main([str(run_file)]) == 0
    run_dir = run_file.parent / "runs" / "ci"
    for stage in STAGES:
        assert (run_dir / stage / MARKER).is_file(), stage
    assert any((run_dir / "filter" / "rejected").rglob("*.jsonl*"))  # the Github document is dropped with a reason
    assert json.loads((run_dir / "dedup" / "manifest.json").read_text())
    assert any((run_dir / "blend" / "documents").iterdir())
    assert (run_dir / "tokenizer" / "tokenizer.json").is_file()
    for stage in ("pretrain", "msit"):
        assert list((run_dir / stage / "checkpoints").glob("step-*/.complete"))
    assert (run_dir / "export" / "model.safetensors").is_file()
    assert (run_dir / "export" / "tokenizer.json").is_file()
    for name in ("synthetic", "polarity"):
        assert (run_dir / "icl" / name / "results.json").is_file()
    report = json.loads((run_dir / "report" / "results.json").read_text())
    assert set(report) >= {"run", "stage_seconds", "peak_rss_gib", "data", "icl", "ppl"}
    assert set(report["stage_seconds"]) == set(STAGES)
    assert set(report["icl"]) == {"synthetic", "polarity"}
    assert set(report["icl"]["synthetic"]["headline"]) == {"incremental", "concat"}
    assert report["ppl"]["protocols"]["cached"]["overall"]["tokens"] > 0
    summary = (run_dir / "report" / "summary.md").read_text()
    assert "## ICL: synthetic" in summary and "## Perplexity vs context length" in summary
    assert (run_dir / "report" / "perplexity_vs_length.png").is_file()


def test_second_run_skips_every_stage(run_file, capsys):
    run_dir = run_file.parent / "runs" / "ci"
    before = markers(run_dir)
    capsys.readouterr()
    assert main([str(run_file)]) == 0
    out = capsys.readouterr().out
    assert markers(run_dir) == before
    assert all(f"[{stage}] complete, skipped" in out for stage in STAGES)


def test_from_pretrain_reruns_only_the_later_stages(run_file):
    run_dir = run_file.parent / "runs" / "ci"
    before = markers(run_dir)
    assert main([str(run_file), "--from", "pretrain"]) == 0
    after = markers(run_dir)
    order = list(STAGES)
    for stage in order:
        changed = after[stage] != before[stage]
        assert changed == (order.index(stage) >= order.index("pretrain")), stage


def test_changed_arguments_of_a_complete_stage_are_refused(run_file, tmp_path, capsys):
    changed = tmp_path / "changed.toml"
    changed.write_text(run_file.read_text().replace('vocab_size = 300', 'vocab_size = 320'))
    assert main([str(changed)]) == 2
    assert "--from tokenizer" in capsys.readouterr().err


def test_unknown_section_names_the_file_and_the_valid_ones(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[run]\nname = 'x'\n[trian]\nsteps = 1\n")
    assert main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.toml" in err and "trian" in err and "pretrain" in err


def test_only_a_stage_whose_predecessors_are_incomplete_is_refused(run_file, tmp_path, capsys):
    fresh = tmp_path / "fresh.toml"
    fresh.write_text(run_file.read_text().replace('name = "ci"', 'name = "fresh"'))
    assert main([str(fresh), "--only", "icl"]) == 2
    err = capsys.readouterr().err
    assert "not complete" in err and "filter" in err
    assert not (run_file.parent / "runs" / "fresh" / "icl").exists()
