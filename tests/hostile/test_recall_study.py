"""The recall study's commands under hostile flags (issue "Hostile inputs, fourth round").

    python -m pytest tests/hostile/test_recall_study.py -q

`evalm train recall --batch-size 1e9` or `--n-layer 1e9` grew without a line until killed;
`--width`, `--seq-len`, `--vocab` or `--window 1e9` ended in the allocator's error reported as a bug,
and so did `--lr nan`, `--mqar-share 2`, `--vocab 3`, `--window 0`. `evalm eval recall-cells
--items 1e9` drew 484 GiB of arrays before failing as a bug; `--lengths 0` or `--items 0` ended in a
bug line, `--lengths 1e9` was accepted. After its `model.json` was edited, a model's cells folder
took the cells of the other model the edit made. Now: bounds on every flag, a memory estimate
before any model is built, and the model recorded by content with the cells.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.hostile.conftest import refused_in_process

TRAIN = ["train", "recall", "--arch", "eva", "--width", "8"]
BILLION = "1000000000"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished two-step EVA model of the study."""
    from evalm.train.recall import main

    out = tmp_path_factory.mktemp("recall") / "eva-8"
    assert main(["--arch", "eva", "--width", "8", "--steps", "2", "--out", str(out)]) == 0
    return out


SIZES = ["--batch-size", "--n-layer", "--width", "--seq-len", "--vocab", "--window"]

IN_ONE_PROCESS = """
import contextlib, io, json, sys
from evalm.launcher.cli import main

for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(argv)
    print(json.dumps([code, err.getvalue()]), flush=True)
"""


def _each_refused(commands: list[list], timeout: float = 150) -> list[str]:
    """Each command in turn in one process (one start of torch, not one each) under a 3 GiB address-space
    cap: the one line of each refusal, in order. Before the bounds the first hung or took all memory."""
    import os
    import resource
    import subprocess
    import sys

    from tests.hostile.limits import GiB, REPO

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 * GiB, 3 * GiB))

    argv = json.dumps([[str(a) for a in c] for c in commands])
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    try:
        done = subprocess.run([sys.executable, "-c", IN_ONE_PROCESS, argv], env=env, capture_output=True, text=True,
                              timeout=timeout, preexec_fn=cap)
    except subprocess.TimeoutExpired as stop:  # subprocess.run has killed it
        raise AssertionError(f"still running after {timeout} s: {stop.stdout}") from None
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == len(commands), done.stderr[-3000:]
    lines = []
    for code, err in results:
        assert code == 2 and "bug:" not in err and "Traceback" not in err, err[-3000:]
        lines.append([line for line in err.splitlines() if line.strip()][-1])
    return lines


def test_a_billion_in_any_size_flag_or_model_file_is_refused_with_the_estimate(tmp_path, trained):
    wide = tmp_path / "wide"
    shutil.copytree(trained, wide)
    _edit(wide / "model.json", width=10**9)
    lines = _each_refused([*([*TRAIN, "--out", tmp_path / flag, flag, BILLION] for flag in SIZES),
                           ["eval", "recall-cells", "--model", wide, "--out", tmp_path / "cells"]])
    for flag, line in zip(SIZES, lines):
        assert f"{flag} {BILLION}" in line and "needs at least" in line and "GiB available" in line, line
    assert f"{wide}: eva-1000000000 (about 2.4e+19 parameters)" in lines[-1] and "needs at least" in lines[-1]
    assert not any((tmp_path / name).exists() for name in (*SIZES, "cells"))


@pytest.mark.parametrize("flags, said", [
    (["--lr", "nan"], "--lr nan: a learning rate is a finite number > 0"),
    (["--lr", "-1"], "--lr -1.0: a learning rate is a finite number > 0"),
    (["--mqar-share", "2"], "--mqar-share 2.0: a share of the batch, from 0 to 1"),
    (["--threads", "0"], "--threads 0: from 1 to this machine's"),
    (["--threads", "1000000"], "--threads 1000000: from 1 to this machine's"),
    (["--seq-len", "0"], "--seq-len 0: at least 64"),
    (["--train-kv", "0"], "--train-kv 0: every number of pairs must be >= 1"),
    (["--vocab", "3"], "--vocab 3: at least 34"),
    (["--window", "0"], "--window 0: must be >= 1"),
    (["--n-layer", "0"], "--n-layer 0: must be >= 1"),
    (["--chunk", BILLION], f"--window 16: a multiple of --chunk {BILLION}"),
    (["--width", "65"], "--width 65: the model has width // 32 = 2 heads"),
    (["--seed", "-1"], "--seed -1: from 0 to 2**63 - 1"),
])
def test_training_values_are_refused_in_one_line(tmp_path, flags, said):
    line = refused_in_process([*TRAIN, "--out", tmp_path / "o", *flags])
    assert said in line, line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flags, said", [
    (["--items", BILLION], f"--items {BILLION}: from 1 to 10,000 test sequences"),
    (["--items", "0"], "--items 0: from 1 to 10,000"),
    (["--long-items", "0"], "--long-items 0: from 1 to 10,000"),
    (["--lengths", BILLION], f"--lengths {BILLION}: from 32"),
    (["--lengths", "0"], "--lengths 0: from 32"),
    (["--lengths", "64,-5"], "--lengths -5: from 32"),
    (["--test-kv", "0"], "--test-kv 0: every number of pairs must be >= 1"),
    (["--test-kv", "-1"], "--test-kv -1: every number of pairs must be >= 1"),
    (["--threads", "0"], "--threads 0: from 1 to this machine's"),
    (["--long-from", "-1"], "--long-from -1: must be >= 1"),
])
def test_cell_values_are_refused_in_one_line(tmp_path, trained, flags, said):
    line = refused_in_process(["eval", "recall-cells", "--model", trained, "--out", tmp_path / "o", *flags])
    assert said in line, line
    assert not (tmp_path / "o").exists()


def test_cells_of_an_edited_model_are_not_mixed_with_the_first_ones(tmp_path, trained):
    model, cells = tmp_path / "model", tmp_path / "cells"
    shutil.copytree(trained, model)
    small = ["--test-kv", "4", "--lengths", "64", "--ablations", "", "--items", "2", "--long-items", "2"]
    from evalm.icl_eval.recall.study_cells import main

    assert main(["--model", str(model), "--out", str(cells), *small]) == 0
    written = sorted(p.name for p in cells.glob("eva-*.json"))
    _edit(model / "model.json", window=32)  # the same weights, read as another model
    line = refused_in_process(["eval", "recall-cells", "--model", model, "--out", cells, *small, "--test-kv", "4,8"])
    assert f"{cells} holds cells of another model" in line and "model_files.model.json" in line, line
    assert "the model changed since these cells were read" in line, line
    assert sorted(p.name for p in cells.glob("eva-*.json")) == written  # was: a kv-8 cell of the other model


def _edit(path: Path, **values) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))
