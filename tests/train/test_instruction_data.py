"""MSIT instruction data through `datasets`, offline: files, saved folders, a cached FLAN-style id.

Every source holds the same examples, so each must pack to exactly the lines the plain jsonl
(the pre-existing format) packs to. HF_HOME is a temporary folder (conftest).

    python -m pytest tests/train/test_instruction_data.py -q
"""

from __future__ import annotations

import json
import tracemalloc

import datasets
import numpy as np
import pytest

from evalm.text.data_source import DataSourceError
from evalm.text.tokenizer import ByteTokenizer
from tests.hub_cache import write_hub_cache
from evalm.train.config import MsitDataConfig, load_run_config
from evalm.train.packing import build_lines, iter_examples

FLAN_COLUMNS = {"task": "task_name", "input": "inputs", "output": "targets"}  # Muennighoff/flan's names


def rows(n: int = 30) -> list[dict]:
    return [{"task": t, "input": f"{t} question {i}", "output": f"answer {i * 7 % 11}"}
            for i in range(n) for t in ("nli", "qa", "sentiment")]


def flan(rs: list[dict]) -> dict[str, list]:
    """The same rows with FLAN collection column names and an extra column."""
    return {"inputs": [r["input"] for r in rs], "targets": [r["output"] for r in rs],
            "task_name": [r["task"] for r in rs], "template_type": ["zs_opt"] * len(rs)}


def packed(train_file: str, columns=None, **kw):
    kw = {"seq_len": 96, "held_out_tasks": ["qa"], **({"columns": columns} if columns else {}), **kw}
    config = MsitDataConfig(train_file=train_file, **kw)
    lines, stats = build_lines(config, ByteTokenizer())
    return lines.ids, lines.masks, stats


def test_every_source_packs_the_lines_of_the_plain_jsonl(tmp_path):
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    ids, masks, stats = packed(str(plain))
    assert stats["removed_held_out"] == 30 and stats["tasks"] == ["nli", "sentiment"]
    data = datasets.Dataset.from_dict(flan(rows()))
    data.to_parquet(str(tmp_path / "flan.parquet"))
    data.to_csv(str(tmp_path / "flan.csv"))
    data.save_to_disk(str(tmp_path / "saved"))
    write_hub_cache(tmp_path, "Muennighoff/flan", None, {"train": flan(rows()), "test": flan(rows(2))})
    for source in ("flan.parquet", "flan.csv", "saved"):
        got = packed(str(tmp_path / source), FLAN_COLUMNS)
        assert np.array_equal(got[0], ids) and np.array_equal(got[1], masks) and got[2] == stats, source
    got = packed("Muennighoff/flan:train", FLAN_COLUMNS)
    assert np.array_equal(got[0], ids) and np.array_equal(got[1], masks)


def test_missing_column_and_missing_dataset_are_clear(tmp_path):
    datasets.Dataset.from_dict(flan(rows(2))).to_parquet(str(tmp_path / "flan.parquet"))
    with pytest.raises(ValueError, match=r"flan.parquet: row 1 has no 'input', 'output', 'task'.*data.columns"):
        list(iter_examples(tmp_path / "flan.parquet"))
    with pytest.raises(DataSourceError, match=r"load_dataset\('Open-Orca/FLAN'\)"):
        list(iter_examples("Open-Orca/FLAN:train", FLAN_COLUMNS))
    with pytest.raises(DataSourceError, match="no such file"):
        list(iter_examples(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match="columns must map exactly"):
        MsitDataConfig(columns={"task": "t", "inputs": "i", "output": "o"})


def test_run_file_maps_columns_of_a_cached_collection(tmp_path):
    write_hub_cache(tmp_path, "Muennighoff/flan", None, {"train": flan(rows(4))})
    run = tmp_path / "msit.toml"
    run.write_text('[data]\ntrain_file = "Muennighoff/flan:train"\nseq_len = 64\n'
                   '[data.columns]\ntask = "task_name"\ninput = "inputs"\noutput = "targets"\n')
    config = load_run_config(run, [], MsitDataConfig).data
    assert [e.input for e in iter_examples(config.train_file, config.columns)][:3] == [
        "nli question 0", "qa question 0", "sentiment question 0"]


def test_held_out_rows_stream_past_without_being_kept(tmp_path):
    """3,000 held-out rows of 2 kB stream through; memory holds the 2 kept examples' tokens, not 6 MB."""
    big = [{"task": "held", "input": "x" * 2000, "output": "y"}] * 3000 + rows(1)
    datasets.Dataset.from_list(big).to_parquet(str(tmp_path / "big.parquet"))
    tracemalloc.start()
    _, _, stats = packed(str(tmp_path / "big.parquet"), held_out_tasks=["held", "qa"])
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert stats["removed_held_out"] == 3001 and stats["examples"] == 2
    assert peak < 3000 * 2000 / 4, peak
