"""docs/results.md's GPU tables from a device run's evidence (launcher/gpu_tables.py), on a small
synthetic run folder in a git repository made here:

    python -m pytest tests/launcher/test_gpu_tables.py -q

A run whose CUDA tests passed at the commit its sources are makes the tables, between the markers
and nowhere else; a failed test, a section at another commit, or sources that differ from the
commit are each refused in one line, the page untouched. The evidence folder docs/runs/ is tracked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from evalm.launcher import gpu_tables
from evalm.launcher.device_run import sources

ROOT = Path(__file__).resolve().parents[2]
PAGE = f"# Results\n\nbefore\n\n{gpu_tables.BEGIN}\nold figures\n{gpu_tables.END}\n\nafter\n"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A repository with a source file and the results page, committed; HEAD's id."""
    root = tmp_path / "repo"
    (root / "evalm").mkdir(parents=True)
    (root / "docs").mkdir()
    (root / "evalm" / "flex.py").write_text("ROUTE = 'flex'\n")
    (root / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (root / "docs" / "results.md").write_text(PAGE)
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    return root, git(root, "rev-parse", "HEAD")


def evidence(root: Path, commit: str, **changes) -> Path:
    """A run folder as launcher/device_run.py writes it: three tests passed, one row per section."""
    folder = root / "docs" / "runs" / f"2026-11-29-{commit[:7]}"
    folder.mkdir(parents=True)
    files = {
        "env": {"commit": commit, "device": "NVIDIA H200", "nvidia_smi": "NVIDIA H200, 570.1, 143771 MiB",
                "torch": "2.11.0+cu130", "cuda": "13.0", "triton": "3.6.0", "python": "3.12.3",
                "started_utc": "2026-11-29T03:00:00+00:00", "sources": sources(root)},
        "tests": {"section": "tests", "commit": commit, "status": "ok", "rc": 0, "seconds": 61.5,
                  "counts": {"passed": 3, "failed": 0, "error": 0, "skipped": 0},
                  "tests": [{"name": f"tests.evalm.test_flex_cuda::test_{n}", "outcome": "passed", "seconds": 9.5,
                             "message": ""} for n in ("a", "b", "c")]},
        "attention": {"section": "attention", "commit": commit, "status": "ok", "seconds": 80, "timeout_s": 100,
                      "gpu": {"peaks_tflops": {"measured": 750.0, "datasheet": 989.0}},
                      "result": {"rows": [{"n": 8192, "batch": 4, "dropout": 0.0, "eva_ms": 3.0, "sdpa_ms": 9.0,
                                           "speedup": 3.0, "cudnn_ms": 7.5, "speedup_fastest": 2.5, "flop_limit": 7.1, "eva_tflops": 90, "sdpa_tflops": 210,
                                           "eva_peak_gib": 0.5, "sdpa_peak_gib": 0.4},
                                          {"n": 131072, "dropout": 0.0, "skipped": "budget"}]}},
        "train": {"section": "train", "commit": commit, "status": "timeout", "seconds": 160, "timeout_s": 160,
                  "result": None},
    }
    for name, value in {**files, **changes}.items():
        (folder / f"{name}.json").write_text(json.dumps(value))
    return folder


def tables(root: Path, folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evalm.launcher.gpu_tables", str(folder), "--results",
                           str(root / "docs" / "results.md")], capture_output=True, text=True, timeout=120)


def test_a_run_whose_tests_passed_at_its_commit_makes_the_tables_between_the_markers(repo):
    root, commit = repo
    done = tables(root, evidence(root, commit))
    assert done.returncode == 0, done.stderr
    page = (root / "docs" / "results.md").read_text()
    head, block = page.split(gpu_tables.BEGIN)
    block, tail = block.split(gpu_tables.END)
    assert head == "# Results\n\nbefore\n\n" and tail == "\n\nafter\n" and "old figures" not in block
    assert f"commit {commit[:12]}, NVIDIA H200" in block and "torch 2.11.0+cu130" in block and "Triton 3.6.0" in block
    assert "CUDA tests (tests.log): 3 passed, 0 skipped in 62 s." in block and "| `test_a` | passed | 9.5 |" in block
    assert "| 8,192 | 4 | 0.0 | 3.00 | 9.00 | 7.50 | 3.00× / **2.50×** | 7.1× | 90 / 210 | 0.50 / 0.40 |" in block
    assert "| 131072 | skipped: budget |" in block
    assert "train: timeout after 160 s of 160 s; its output in train.log." in block and "cache: not run." in block


def test_a_training_row_shows_its_mfu_in_both_counts_and_its_graphs_and_breaks(repo):
    root, commit = repo
    row = {"n": 8192, "attention": "eva", "compiled": True, "tokens_per_s": 60000.0, "step_s": 0.55, "mfu_datasheet": 0.14,
           "mfu_torchtitan": 0.27, "peak_gib": 27.3, "loss_first": 10.85, "loss_last": 10.84, "graphs": 9,
           "breaks": {"torch.compiler.disable": 4, "generator": 2},
           "flops_per_token": {"params": 2.12e9, "attention": 1.7e8, "keys_per_query": 576.0, "total": 2.29e9, "torchtitan": 4.5e9}}
    train = {"section": "train", "commit": commit, "status": "ok", "seconds": 100, "timeout_s": 140, "result": {"rows": [row]}}
    done = tables(root, evidence(root, commit, train=train))
    assert done.returncode == 0, done.stderr
    line = "| 8,192 | eva compiled | 60,000 | 0.550 | 14.0% / 27.0% | 2.12 + 0.17 (K = 576.0) | 27.3 | 10.85 → 10.84 | 9 / 6 |"
    assert line in (root / "docs" / "results.md").read_text()


@pytest.mark.parametrize("case", ["failed test", "skipped test", "no test", "section at another commit", "sources differ"])
def test_a_run_whose_figures_would_not_stand_is_refused_in_one_line(repo, case):
    root, commit = repo
    tests = {"section": "tests", "commit": commit, "status": "failed", "rc": 1, "seconds": 50,
             "counts": {"passed": 2, "failed": 1, "error": 0, "skipped": 0},
             "tests": [{"name": "t::test_bias_gradient", "outcome": "failed", "seconds": 3, "message": "assert"}]}
    changes = {
        "failed test": {"tests": tests},
        "skipped test": {"tests": {**tests, "status": "ok", "rc": 0, "counts": {"passed": 2, "skipped": 1},
                                   "tests": [{**tests["tests"][0], "outcome": "skipped"}]}},
        "no test": {"tests": {**tests, "status": "ok", "rc": 0, "tests": [], "counts": {"passed": 0}}},
        "section at another commit": {"train": {"section": "train", "commit": "f" * 40, "status": "ok", "result": {}}},
        "sources differ": {},
    }[case]
    folder = evidence(root, commit, **changes)
    if case == "sources differ":
        (root / "evalm" / "flex.py").write_text("ROUTE = 'edited after the commit'\n")
        env = json.loads((folder / "env.json").read_text())
        (folder / "env.json").write_text(json.dumps({**env, "sources": sources(root)}))
    done = tables(root, folder)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    want = {"failed test": "test_bias_gradient", "skipped test": "1 skipped: t::test_bias_gradient", "no test": "did not all pass",
            "section at another commit": "train at", "sources differ": "evalm/flex.py"}[case]
    assert want in done.stderr and str(folder) in done.stderr
    assert (root / "docs" / "results.md").read_text() == PAGE


def test_the_evidence_folder_is_tracked():
    for path in ("docs/runs/2026-11-29-abc1234/env.json", "docs/runs/x/tests.xml"):
        done = subprocess.run(["git", "check-ignore", "-v", path], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 1, f"{path} is ignored: {done.stdout}"
    assert subprocess.run(["git", "check-ignore", "-q", "runs/x.json"], cwd=ROOT).returncode == 0  # runs/ stays ignored


def test_the_results_page_holds_the_markers_once():
    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert page.count(gpu_tables.BEGIN) == 1 and page.count(gpu_tables.END) == 1
