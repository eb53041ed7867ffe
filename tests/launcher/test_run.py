"""`evalm run` end to end on a CI-sized config: every stage's outputs, the report, skipping, --from.

    python -m pytest tests/launcher/test_run.py -q

The samples are written by the test (no network); the stages are the real commands. The first test
runs the README's main-job line (`evalm run`, read from README.md) with one edit: the CI-sized run
file below is named after it (the README's default is the tiny config, minutes on a CPU).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from evalm.launcher.cli import main as evalm
from evalm.launcher.markers import MARKER
from evalm.launcher.run import main
from evalm.launcher.stages import STAGES
from tests.doc_lines import command_lines
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
# bytes only (256 + </s> + <pad>): on this small corpus a BPE merges " A" but not " B", " C", " D", and labels of
# unequal token counts bias instance-sum scores. With bytes the template has no space before the label, so
# each example is `x L </s>` with the label one token, as the tiny run's 1,024-id BPE makes " L"
vocab_size = 258

[pretrain]
config = "{REPO / 'configs' / 'pretrain-tiny.toml'}"
set = ["model.attn_dropout=0.0", "train.steps=3", "train.batch_size=2", "data.seq_len=64",
       "checkpoint.save_every=3", "train.log_every=1"]

[msit]
config = "{REPO / 'configs' / 'msit-tiny.toml'}"
synthetic_episodes = 1000
synthetic_examples = 120
synthetic_inputs = [2, 4, 8]  # CI size: 8-input rules (the tiny run: 16)
sample_instructions = 10
set = ["model.attn_dropout=0.0", "train.steps=500", "train.batch_size=8", "data.seq_len=512",
       "optim.lr=3e-3", "optim.warmup_steps=25", "checkpoint.save_every=500", "train.log_every=50",
       "data.pretrain_fraction=0.1", "data.default_template=[\\"{{input}}\\", \\"{{output}}\\"]"]

[twins]
full = ["model.attention=full", "train.steps=2"]
absolute = ["model.positions=absolute"]

[[eval]]
name = "synthetic"
task = "synthetic"
models = ["msit", "full-msit"]
args = ["--shots", "0,4,64", "--seeds", "1,2", "--methods", "incremental,concat", "--eval.separator=eos",
        "--synthetic.template={{x}}{{label}}", "--synthetic.n_inputs=8"]

[[eval]]
name = "polarity"
task = "tasks/polarity/task.toml"
args = ["--shots", "0,2", "--seeds", "1", "--methods", "incremental,structured", "--test-items", "4",
        "--eval.method.group_tokens=256"]

[ppl]
models = ["pretrain", "msit", "absolute-pretrain"]
args = ["--lengths", "64,256", "--max-tokens", "256", "--ppl.segment_tokens=64", "--ppl.max_books=1",
        "--fixed-contexts", "16,64,128", "--ppl.fixed_target_tokens=32", "--ppl.fixed_targets_per_book=2"]

[recall]
# 64-token lines: a passkey prompt in bytes needs ~250 tokens, so 8x and 16x the training length
multiples = [8, 16]
args = ["--depths", "50", "--seeds", "1", "--items", "1"]
""")
    return path


def readme_main_job() -> str:
    """The README's main-job line, as command_lines() reads it."""
    lines = [line for where, line in command_lines() if where == "README.md" and line.startswith("evalm run")]
    assert len(lines) == 1, lines
    return lines[0]


def markers(run_dir: Path) -> dict[str, float]:
    return {stage: (run_dir / stage / MARKER).stat().st_mtime_ns for stage in STAGES}


@pytest.fixture(scope="module")
def ran(run_file) -> Path:
    """The CI run made by the README's main-job line, once per module: the later tests read and rerun its
    folder (each asks for this fixture, so any one of them runs alone, `-m slow` included)."""
    assert evalm([*shlex.split(readme_main_job())[1:], str(run_file)]) == 0
    return run_file


def test_every_stage_runs_and_writes_its_outputs(ran):
    run_file = ran
    run_dir = run_file.parent / "runs" / "ci"
    for stage in STAGES:
        assert (run_dir / stage / MARKER).is_file(), stage
    assert any((run_dir / "filter" / "rejected").rglob("*.jsonl*"))  # the Github document is dropped with a reason
    assert json.loads((run_dir / "dedup" / "manifest.json").read_text())
    assert any((run_dir / "blend" / "documents").iterdir())
    assert (run_dir / "tokenizer" / "tokenizer.json").is_file()
    for folder in ("pretrain", "msit", "twins/full/pretrain", "twins/full/msit", "twins/absolute/pretrain"):
        assert list((run_dir / folder / "checkpoints").glob("step-*/.complete")), folder
    for model in ("pretrain", "msit", "full-pretrain", "full-msit", "absolute-pretrain"):
        assert (run_dir / "export" / model / "model.safetensors").is_file(), model
    configs = {m: json.loads((run_dir / "export" / m / "config.json").read_text())["model"]
               for m in ("msit", "full-msit", "absolute-pretrain")}
    assert (configs["msit"]["attention"], configs["full-msit"]["attention"]) == ("eva", "full")
    assert (configs["msit"]["positions"], configs["absolute-pretrain"]["positions"]) == ("circular", "absolute")
    for name, model in (("synthetic", "msit"), ("synthetic", "full-msit"), ("polarity", "msit")):
        assert (run_dir / "icl" / name / model / "results.json").is_file()
    report = json.loads((run_dir / "report" / "results.json").read_text())
    assert set(report) >= {"run", "run_totals", "this_invocation", "data", "icl", "ppl"}
    assert set(report["run_totals"]["stage_seconds"]) == set(STAGES)
    assert set(report["icl"]) == {"synthetic", "polarity"} and set(report["icl"]["synthetic"]) == {"msit", "full-msit"}
    cells = report["icl"]["synthetic"]["msit"]["summary"]["test"]["incremental"]
    for cell in cells.values():  # every accuracy beside its baselines and interval
        assert set(cell["baselines"]) == {"chance", "test_majority", "in_context_majority"}
        lo, hi = cell["accuracy_ci95"]
        assert lo <= cell["accuracy_mean"] <= hi
        assert cell["gain"]["over"] in cell["baselines"]
    # the tuned EVA model learns in context: at 64 shots it beats every label baseline, interval included
    # (CI size: rules of 8 inputs, tuning on 2/4/8-input episodes; the tiny run does the same with 16)
    assert cells["64"]["gain"]["ci95"][0] > 0, cells["64"]
    assert cells["64"]["accuracy_mean"] > cells["0"]["accuracy_mean"] + 0.2
    ppl = report["ppl"]
    assert set(ppl) == {"pretrain", "msit", "absolute-pretrain"}
    for res in ppl.values():
        assert res["protocols"]["cached"]["overall"]["bits_per_byte"] > 0
        assert set(res["references"]) == {"uniform", "unigram"}
        assert [row["context"] for row in res["fixed_position"]["rows"]] == [16, 64, 128]
    recall = report["recall"]
    assert set(recall["models"]) == {"pretrain", "full-pretrain", "absolute-pretrain"}
    assert {(c["task"], c["length"], c["depth"]) for res in recall["models"].values() for c in res["cells"]} == \
        {("passkey", 512, 50), ("passkey", 1024, 50)}
    assert recall["line"].startswith("passkey at 512 / 1,024 tokens: pretrain ")
    summary = (run_dir / "report" / "summary.md").read_text()
    assert recall["line"] in summary
    assert "Why this line: it runs every model's cache through prompts of up to 16x" in summary  # what it shows
    assert "## ICL: synthetic" in summary and "## Perplexity vs context length" in summary
    assert "in-context majority" in summary and "unigram" in summary
    assert (run_dir / "report" / "perplexity_vs_length.png").is_file()
    assert (run_dir / "report" / "icl_synthetic_accuracy_vs_shots.png").is_file()


def test_second_run_skips_every_stage_and_keeps_the_first_runs_figures(ran, capsys):
    run_file = ran
    run_dir = run_file.parent / "runs" / "ci"
    before = markers(run_dir)
    first = json.loads((run_dir / "report" / "results.json").read_text())["run_totals"]
    capsys.readouterr()
    assert main([str(run_file)]) == 0
    out = capsys.readouterr().out
    assert markers(run_dir) == before
    assert all(f"{stage}: complete, skipped" in out for stage in STAGES)
    report = json.loads((run_dir / "report" / "results.json").read_text())
    assert report["run_totals"] == first  # the first invocation's seconds and memory are kept
    assert report["this_invocation"]["stages_run"] == []


@pytest.mark.slow  # retrains every model of the CI run (about 100 s on 2 cores)
def test_from_pretrain_reruns_only_the_later_stages(ran):
    run_file = ran
    run_dir = run_file.parent / "runs" / "ci"
    before = markers(run_dir)
    assert main([str(run_file), "--from", "pretrain"]) == 0
    after = markers(run_dir)
    order = list(STAGES)
    for stage in order:
        changed = after[stage] != before[stage]
        assert changed == (order.index(stage) >= order.index("pretrain")), stage


# reruns four stages of the CI run (~50 s on 2 cores); the unit keys' reruns are checked in seconds by
# tests/launcher/test_study.py (a changed step and every step after it)
@pytest.mark.slow
def test_a_changed_task_file_reruns_that_stage_and_every_later_one(ran, capsys):
    """Stage keys cover the content of the files a stage reads (here the polarity task file the
    icl stage names), chained through the later stages; earlier stages are untouched."""
    run_file = ran
    run_dir = run_file.parent / "runs" / "ci"
    before = markers(run_dir)
    task = run_file.parent / "samples" / "tasks" / "polarity" / "task.toml"
    task.write_text(task.read_text().replace("Sentiment: {label}", "Verdict: {label}"))
    capsys.readouterr()
    assert main([str(run_file)]) == 0
    assert "icl: its settings or inputs changed; redoing it" in capsys.readouterr().out
    after = markers(run_dir)
    order = list(STAGES)
    for stage in order:
        assert (after[stage] != before[stage]) == (order.index(stage) >= order.index("icl")), stage
    report = json.loads((run_dir / "icl" / "polarity" / "msit" / "results.json").read_text())
    assert "Verdict" in report["protocol"]["template"]


# reruns three stages of the CI run (~60 s on 2 cores); --only's stale marks are checked in seconds by
# tests/launcher/test_study.py (one runner for both)
@pytest.mark.slow
def test_only_a_stage_marks_the_later_ones_stale(ran, capsys):
    run_file = ran
    """With `jobs = 1` (one step at a time, in this process): the same keys, so nothing else reruns."""
    run_dir = run_file.parent / "runs" / "ci"
    assert main([str(run_file), "--only", "icl", "--set", "run.jobs=1"]) == 0
    assert json.loads((run_dir / "ppl" / MARKER).read_text())["stale"] is True
    assert json.loads((run_dir / "recall" / MARKER).read_text())["stale"] is True
    before = markers(run_dir)
    capsys.readouterr()
    assert main([str(run_file)]) == 0
    assert "ppl: marked stale by --only; redoing it" in capsys.readouterr().out
    after = markers(run_dir)
    assert [s for s in STAGES if after[s] != before[s]] == ["ppl", "recall"]


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
    assert "stage 'icl' needs ['export'], not done" in err and "runs/fresh" in err
    assert not (run_file.parent / "runs" / "fresh" / "icl").exists()
