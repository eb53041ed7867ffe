"""benchmarks/gpu.py off the GPU: its refusal without CUDA and its report's tables (a GPU run's last
step must not be the one that fails: the tables are rendered from the JSON every section wrote)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def gpu_module():
    """benchmarks/gpu.py as its run loads it: its folder first on sys.path (for `import timing`), for the import only."""
    spec = importlib.util.spec_from_file_location("gpu_benchmark", ROOT / "benchmarks" / "gpu.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_without_a_gpu_it_says_so_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "no CUDA GPU" in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_tables_hold_every_row_with_skipped_and_failed_sections_named():
    report = {
        "device": "NVIDIA H200", "torch": "2.11.0", "cuda": "13.0", "commit": "abc1234",
        "peaks_tflops": {"measured": 753.0, "datasheet": 989.0},
        "attention": {"rows": [
            {"n": 8192, "batch": 4, "dropout": 0.0, "eva_ms": 3.63, "sdpa_ms": 7.46, "speedup": 2.06, "flop_limit": 7.1,
             "eva_tflops": 75, "sdpa_tflops": 258, "eva_peak_gib": 0.55, "sdpa_peak_gib": 0.38},
            {"n": 131072, "dropout": 0.0, "skipped": "budget"}]},
        "train": {"error": "RuntimeError: out of memory"},
        "cache": {"rows": [{"attention": "eva", "shots": 2000, "tokens": 21838, "encode_s": 3.8, "item_ms": 95.2,
                            "cache_mib": 263.4, "kv_cache_mib": 2047.3}]},
        "total_s": 272.0,
    }
    text = gpu_module().table(report)  # the rows as launcher/gpu_tables.py writes them into docs/results.md
    assert "NVIDIA H200, torch 2.11.0 (CUDA 13.0), commit abc1234; bf16 matrix products 753 TFLOP/s" in text
    assert "| 8,192 | 4 | 0.0 | 3.63 | 7.46 | n/a | 2.06× / **2.06×** | 7.1× | 75 / 258 | 0.55 / 0.38 |" in text
    assert "| 131072 | skipped: budget |" in text
    assert "train: error: RuntimeError: out of memory" in text
    assert "| eva | 2,000 | 21,838 | 3.80 | 95.20 | 263.4 | 2047.3 |" in text
    assert text.rstrip().endswith("total 272 s")


def test_each_saved_row_lands_whole_in_gpu_json(tmp_path):
    """The device run kills a section at its timeout and reads gpu.json: the rows finished so far are
    there, and no half-written file or temporary is left."""
    report = {"device": "NVIDIA H200"}
    save = gpu_module()._saver(tmp_path / "gpu.json", report)
    save("attention", [{"n": 8192, "eva_ms": 3.0}])
    assert json.loads((tmp_path / "gpu.json").read_text())["attention"] == {"rows": [{"n": 8192, "eva_ms": 3.0}], "partial": True}
    report["attention"] = {"rows": [], "section_s": 1.0}
    save()
    assert json.loads((tmp_path / "gpu.json").read_text())["attention"] == {"rows": [], "section_s": 1.0}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu.json"]


def test_every_name_the_gpu_sections_import_exists():
    """The sections import the project's modules inside functions, which only a GPU runs: a renamed
    function would fail there, after minutes of device time. Every `from evalm... import name` of the
    script resolves here."""
    import ast
    import importlib

    tree = ast.parse((ROOT / "benchmarks" / "gpu.py").read_text(encoding="utf-8"))
    imports = [(node.module, alias.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and (node.module or "").startswith("evalm") for alias in node.names]
    assert len(imports) >= 8
    missing = [f"{module}.{name}" for module, name in imports if not hasattr(importlib.import_module(module), name)]
    assert missing == []
