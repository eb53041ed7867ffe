"""`python -m evalm.icl_eval recall` on 2 real gloo ranks against the same command in one process.

    python -m pytest tests/icl_eval/test_recall_ranks.py -q

Each rank is its own process with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT as torchrun sets them
(tests/icl_eval/test_ranks.py's launcher, OMP_NUM_THREADS=1 everywhere); results.json must be the
one-process file apart from `units.EXECUTION` (how long, how many ranks).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalm.icl_eval.protocol.units import without_execution
from tests import models
from tests.icl_eval.test_ranks import rank_units, run

GRID = ["--tasks", "passkey,niah_multikey,mqar", "--lengths", "600,900", "--depths", "0,50,100", "--seeds", "1",
        "--items", "2", "--recall.mqar_pairs=4", "--save-predictions"]
"""3 tasks x 2 lengths x 1 seed: 6 units, 3 on each rank."""


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory) -> Path:
    return models.byte_model(tmp_path_factory.mktemp("byte") / "model")


@pytest.mark.slow  # ~11 s on 2 cores; two-rank ICL stays in CI
def test_recall_on_two_ranks_writes_the_one_process_results(byte_model, tmp_path):
    args = ["recall", "--checkpoint", str(byte_model), *GRID]
    run([*args, "--out", str(tmp_path / "one")], 1)
    (_, stderr), _ = run([*args, "--out", str(tmp_path / "two")], 2)
    one, two = (json.loads((tmp_path / name / "results.json").read_text()) for name in ("one", "two"))
    assert rank_units(tmp_path / "two") == [3, 3]
    assert without_execution(two) == without_execution(one) and len(one["cells"]) == 3 * 2 * 3
    assert two["execution"] == {"ranks": 2, "units": 6, "units_resumed": 0, "units_computed": 6}
    assert (tmp_path / "two" / "predictions.jsonl").read_text() == (tmp_path / "one" / "predictions.jsonl").read_text()
    assert "evalm eval recall: units 6/6 (0 resumed)" in stderr
