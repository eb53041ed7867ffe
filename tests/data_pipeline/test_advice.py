"""An error's own advice works when followed, in the same --output folder.

Run: python -m pytest tests/data_pipeline/test_advice.py -q
"""

from __future__ import annotations

import json
import random
import socket

from .conftest import pile_line, read_records, write_shard
from .test_jobs import _corpus, _text, _tree


def test_changed_settings_list_only_the_differing_keys_and_both_ways_out_work(tmp_path, run_cli, capsys):
    _corpus(tmp_path / "in", 3, 30)
    out = tmp_path / "out"
    base = ["filter", "--input", tmp_path / "in", "--output", out]
    assert run_cli(*base, "--tasks", 2) == 0
    config = tmp_path / "data.toml"
    config.write_text("[filter.default]\nmin_words = 5\n")
    assert run_cli(*base, "--tasks", 3, "--config", config) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("evalm data filter: error")]
    assert len(err) == 1
    err = err[0]
    assert "tasks: recorded 2, now 3" in err and "config.default.min_words: recorded 20, now 5" in err
    assert "inputs" not in err and "stopwords" not in err, "only the differing keys"
    assert len(err.replace(str(out), "OUT")) < 300  # a short diff, not a settings dump
    assert "--tasks" in err and "--config" in err and "--overwrite" in err
    # advice 1: relaunch with the recorded settings continues the folder
    assert run_cli(*base, "--tasks", 2) == 0
    # advice 2: --overwrite starts over with the new settings, as a fresh folder would
    assert run_cli(*base, "--tasks", 3, "--config", config, "--overwrite") == 0
    assert run_cli("filter", "--input", tmp_path / "in", "--output", tmp_path / "fresh", "--tasks", 3, "--config", config) == 0
    assert _tree(out) == _tree(tmp_path / "fresh")


def test_raising_max_error_fraction_in_the_same_folder_finishes_it(tmp_path, run_cli, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    good = [pile_line(_text(random.Random(i), 80), "Pile-CC") for i in range(3)]
    write_shard(folder / "a.jsonl", [b"{bad"] * 2 + good)
    out = tmp_path / "out"
    assert run_cli("filter", "--input", folder, "--output", out) == 2
    assert "raise max_error_fraction in the config" in capsys.readouterr().err
    config = tmp_path / "data.toml"
    config.write_text("[filter]\nmax_error_fraction = 0.5\n")
    assert run_cli("filter", "--input", folder, "--output", out, "--config", config) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["max_error_fraction"] == 0.5 and manifest["stats"]["errors"] == 2


def test_leaving_out_an_unreachable_redis_url_in_the_same_folder_works(tmp_path, run_cli, capsys):
    _corpus(tmp_path / "in", 2, 40)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"redis://127.0.0.1:{s.getsockname()[1]}/0"
    out = tmp_path / "out"
    assert run_cli("dedup", "--input", tmp_path / "in", "--output", out, "--redis-url", url) == 2
    assert "leave --redis-url out" in capsys.readouterr().err
    assert run_cli("dedup", "--input", tmp_path / "in", "--output", out) == 0
    assert run_cli("dedup", "--input", tmp_path / "in", "--output", tmp_path / "memory") == 0
    assert read_records(out / "documents") == read_records(tmp_path / "memory" / "documents")
    assert json.loads((out / "manifest.json").read_text())["index"]["kind"] == "memory"
