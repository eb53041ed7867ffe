"""A study's report (launcher/study_report.py): the tables and goals its file's `[summary]` declares, read from
the study's folder; `evalm run --config FILE --summary` writes it alone, `evalm study summary` is its old name.

    python -m pytest tests/launcher/test_study_report.py -q

The results files are written here in the layout their commands write (`eval ppl`, `eval recall`, `eval icl`);
every figure of the report must be one of them, every goal met, missed or unmeasured as its checks say.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.hostile.conftest import refused_in_process

STUDY = """
[study]
name = "tiny"
root = "{root}"
[study.vars]
trained = 64
[[step]]
name = "only"
run = ["export", "--digest", "{{root}}/none"]
[summary]
title = "a tiny report"
files = ["weights.bin"]
[[summary.goal]]
about = "below the control at the trained length"
checks = [{{ figure = "ppl eva -{{trained}}", op = "<", than = "ppl control -{{trained}}" }}]
[[summary.goal]]
about = "flat past it"
checks = [{{ figure = "ppl eva {{trained}}-", op = "<=", than = "ppl eva -{{trained}}", times = 1.1 }}]
[[summary.goal]]
about = "a needle found"
checks = [{{ figure = "recall eva passkey/128/0,passkey/128/50", op = ">=", than = 0.5 }}]
[[summary.goal]]
about = "cheaper at 16 shots"
checks = [{{ figure = "icl eva 16/seconds_per_item", op = "<", than = "icl eva 64/seconds_per_item" }}]
[[summary.goal]]
about = "more shots help"
checks = [{{ figure = "icl eva 16", op = ">", than = "icl eva 16/test_majority" }},
          {{ figure = "icl eva 64", op = ">=", than = "icl eva 16" }}]
[[summary.table]]
title = "Perplexity"
reader = "ppl"
rows = ["ppl/eva", "ppl/control"]
[[summary.table]]
reader = "recall"
rows = ["recall/eva"]
[[summary.table]]
reader = "icl"
rows = ["icl/eva"]
"""


def results(root: Path) -> None:
    def write(row: str, value) -> None:
        (root / row).mkdir(parents=True)
        (root / row / "results.json").write_text(json.dumps(value))

    def buckets(*ppl):
        return [{"bucket": [lo, hi], "token_ppl": p} for (lo, hi), p in zip(((0, 32), (32, 64), (64, 128)), ppl)]

    write("ppl/eva", {"protocols": {"cached": {"buckets": buckets(20.0, 12.0, 12.5)}},
                      "references": {"uniform": {"buckets": buckets(64.0, 64.0, 64.0)}}})
    write("ppl/control", {"protocols": {"cached": {"buckets": buckets(20.0, 15.0, 40.0)}}})
    write("recall/eva", {"cells": [{"task": "passkey", "length": 128, "depth": d, "accuracy": a, "ci95": [0.0, 1.0],
                                    "chance": 0.01} for d, a in ((0, 0.25), (50, 0.75), (100, 1.0))]})
    base = {k: {"mean": 0.5} for k in ("chance", "test_majority", "in_context_majority")}
    write("icl/eva", {"summary": {"test": {"incremental": {
        "16": {"accuracy_mean": 0.7, "accuracy_ci95": [0.6, 0.8], "baselines": base, "seconds_per_item_mean": 0.02},
        "64": {"accuracy_mean": 0.65, "accuracy_ci95": [0.55, 0.75], "baselines": base, "seconds_per_item_mean": 0.03}}}}})


def study(tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "root"
    root.mkdir(parents=True)
    path = tmp_path / "study.toml"
    path.write_text(STUDY.format(root=root))
    return path, root


def test_the_report_holds_the_declared_rows_and_decides_the_declared_goals(tmp_path, capsys):
    from evalm.launcher.cli import main

    path, root = study(tmp_path)
    results(root)
    assert main(["run", "--config", str(path), "--summary"]) == 0
    text = (root / "summary.md").read_text()
    assert capsys.readouterr().out.strip() == text.strip()
    assert text.startswith(f"# Study tiny: a tiny report ({root})")
    assert "| eva | 20.0 | 12.0 | 12.5 |" in text and "| control | 20.0 | 15.0 | 40.0 |" in text
    assert "| (uniform) | 64.0 | 64.0 | 64.0 |" in text and "[64, 128)" in text
    assert "| eva | passkey | 128 | 0.25 [0.00, 1.00] | 0.75 [0.00, 1.00] | 1.00 [0.00, 1.00] | 0.01 |" in text
    assert "| eva | 16 | 0.700 [0.600, 0.800] | 0.500 | 0.500 | 0.500 |" in text
    assert "- below the control at the trained length: met (ppl eva -64 = 12 < ppl control -64 = 15)" in text
    assert "- flat past it: met (ppl eva 64- = 12.5 <= 1.1 x ppl eva -64 = 12)" in text
    assert "- a needle found: met (recall eva passkey/128/0,passkey/128/50 = 0.75 >= 0.5)" in text
    assert "- more shots help: missed (" in text and "icl eva 64 = 0.65 >= icl eva 16 = 0.7" in text
    # a goal may name the time per test item (configs/study-saicl.toml's speed claim)
    assert ("- cheaper at 16 shots: met (icl eva 16/seconds_per_item = 0.02 < icl eva 64/seconds_per_item = 0.03)"
            in text)
    assert f"- {root / 'weights.bin'}: not written yet" in text
    (root / "weights.bin").write_bytes(b"w")
    assert main(["run", "--config", str(path), "--summary"]) == 0
    assert "sha256 50e721e49c013f00c62cf59f2163542a9d8df02464efeb615d31051b0fddc326" in (root / "summary.md").read_text()


def test_a_goal_whose_figures_were_not_measured_says_so(tmp_path, capsys):
    from evalm.launcher.cli import main

    path, root = study(tmp_path)
    assert main(["run", "--config", str(path), "--summary", "--set", "study.vars.trained=4096"]) == 0
    text = (root / "summary.md").read_text()
    assert "- below the control at the trained length: unmeasured (no ppl eva -4096; ppl control -4096)" in text
    assert "no ppl results yet" in text


def test_a_wrong_summary_or_a_damaged_results_file_is_one_line(tmp_path):
    path, root = study(tmp_path)
    path.write_text(path.read_text().replace('reader = "recall"', 'reader = "recal"'))
    assert "[summary]" in refused_in_process(["run", "--config", path, "--summary"])
    path, root = study(tmp_path / "b")
    results(root)
    (root / "ppl" / "eva" / "results.json").write_text('{"protocols": {}}')
    assert "lacks what its command writes" in refused_in_process(["run", "--config", path, "--summary"])
    (root / "ppl" / "eva" / "results.json").write_text("[1]")
    assert "not a results object" in refused_in_process(["run", "--config", path, "--summary"])


def test_the_old_summary_command_is_the_summaries_studys_report(tmp_path, capsys):
    from evalm.launcher.cli import main

    assert main(["study", "summary", "--root", str(tmp_path), "--trained-length", "4096"]) == 0
    text = (tmp_path / "summary.md").read_text()
    assert text.startswith(f"# Study summaries: EVA's summaries on a converted model ({tmp_path})")
    assert "unmeasured (no ppl lora -4096" in text  # --trained-length is the study's seq_len var


def test_the_saicl_reproduction_is_a_study_whose_goals_are_the_papers_claims(capsys):
    """configs/study-saicl.toml (once benchmarks/saicl_repro.py): three meta-trainings, five evaluations, and the
    paper's four claims as goals on the evaluations' own results."""
    from evalm.launcher.cli import main
    from evalm.launcher.study_file import load_study

    study = load_study(Path(__file__).resolve().parents[2] / "configs" / "study-saicl.toml")
    assert [s for s in study.names() if s.startswith("train-")] == ["train-full", "train-saicl", "train-fid"]
    assert {s: study.step(s).needs for s in study.names() if s.startswith("icl-")} == {
        "icl-concat": ("train-full",), "icl-saicl": ("train-saicl",), "icl-fid": ("train-fid",),
        "icl-ensemble": ("train-full",), "icl-saicl-on-full": ("train-full",)}
    assert len(study.summary.goal) == 4 and study.summary.table[0].reader == "icl"
    assert main(["run", "--config", str(Path(__file__).resolve().parents[2] / "configs" / "study-saicl.toml"), "--list"]) == 0
    assert "icl-saicl-on-full" in capsys.readouterr().out
