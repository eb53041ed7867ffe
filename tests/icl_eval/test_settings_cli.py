"""`evalm eval icl|ppl` settings: no implicit config, flags win, the effective block in results.json,
and nothing the data cannot supply is capped silently (an error, or with --allow-skip a recorded skip).

Run: python -m pytest tests/icl_eval/test_settings_cli.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalm.icl_eval.cli import main

REPO = Path(__file__).resolve().parents[2]
QUICK = ["--synthetic.train_steps=2", "--methods", "incremental", "--seeds", "1"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/icl_eval/conftest.py


def test_no_config_file_unless_named_and_flags_win(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)  # where configs/eval-tiny.toml exists: it must not be read implicitly
    assert main(["icl", "--out", str(tmp_path / "a"), "--shots", "0,1", "--test-items", "3", *QUICK]) == 0
    settings = json.loads((tmp_path / "a" / "results.json").read_text())["settings"]
    assert settings["config"] is None
    assert settings["values"]["eval.method"]["group_tokens"] is None  # eval-tiny.toml says 64
    assert settings["values"]["model"]["d_model"] == 64 and settings["values"]["synthetic"]["train_steps"] == 2
    assert settings["sources"]["eval.shots"] == "--shots" and "eval.method.group_tokens" not in settings["sources"]
    out = capsys.readouterr().out
    assert out.index("evalm eval icl settings") < out.index("no --checkpoint: training")  # printed first

    config = str(REPO / "configs" / "eval-tiny.toml")
    assert main(["icl", "--config", config, "--out", str(tmp_path / "b"), "--shots", "0,1", "--test-items", "3",
                 *QUICK]) == 0
    settings = json.loads((tmp_path / "b" / "results.json").read_text())["settings"]
    assert settings["config"] == config
    assert settings["values"]["eval.method"]["group_tokens"] == 64
    assert settings["sources"]["eval.method.group_tokens"] == "config"
    assert settings["values"]["eval"]["shots"] == [0, 1] and settings["sources"]["eval.shots"] == "--shots"


def test_shots_and_test_items_beyond_the_data_are_errors_or_recorded_skips(tmp_path, capsys):
    # the synthetic family: 512 training items and 100 test items per episode
    assert main(["icl", "--out", str(tmp_path / "a"), "--shots", "0,600", *QUICK]) == 2
    assert "--shots 600: the train split has 512 items" in capsys.readouterr().err
    assert main(["icl", "--out", str(tmp_path / "a"), "--shots", "0", "--test-items", "150", *QUICK]) == 2
    assert "--test-items 150: the test split has 100 items" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()  # refused before any scoring

    assert main(["icl", "--out", str(tmp_path / "b"), "--shots", "0,600", "--test-items", "3", "--allow-skip",
                 *QUICK]) == 0
    res = json.loads((tmp_path / "b" / "results.json").read_text())
    assert [s["shots"] for s in res["skipped"]] == [600] and "512" in res["skipped"][0]["why"]
    assert {r["shots"] for r in res["records"]} == {0}


def test_test_items_beyond_the_validation_split_are_an_error():
    """With the shot count chosen on validation (held out of the training pool here), the same
    --test-items sample is drawn there too: a validation split too small for it is not capped silently."""
    from evalm.icl_eval.config import EvalConfig
    from evalm.config_toolkit import ConfigError
    from evalm.icl_eval.protocol.supply import icl_grid, icl_supply

    config = EvalConfig(shots=(0, 4), test_items=80, choose_shot_on_validation=True, validation_items=50)
    with pytest.raises(ConfigError, match="--test-items 80: the validation split the shot count is chosen on has 50"):
        icl_grid(config, n_train=512, held_out=50, n_test=100, allow_skip=False, n_validation=50)
    kept, skipped = icl_grid(config, n_train=512, held_out=50, n_test=100, allow_skip=True, n_validation=50)
    assert kept.test_items == 80 and skipped == [{"validation_items": 50, "why": skipped[0]["why"]}]
    assert icl_grid(config, 512, 50, 100, False, n_validation=None)[1] == []  # not chosen on validation: no check
    # from the splits: 50 held out of train when the task has no validation split, else its own split
    with pytest.raises(ConfigError, match="chosen on has 50 items"):
        icl_supply(config, {"train": [{}] * 512, "test": [{}] * 100}, allow_skip=False)
    with pytest.raises(ConfigError, match="chosen on has 70 items"):
        icl_supply(config, {"train": [{}] * 512, "validation": [{}] * 70, "test": [{}] * 100}, allow_skip=False)
    with pytest.raises(ConfigError, match=r"--shots 4: the train split has 53 items \(50 held out"):
        icl_supply(config, {"train": [{}] * 53, "test": [{}] * 100}, allow_skip=False)
    assert icl_supply(config, {"train": [{}] * 4, "validation": [{}] * 80, "test": [{}] * 100}, False)[1] == []


@pytest.fixture
def books(tmp_path) -> Path:
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "a.txt").write_text("word " * 60)  # 300 bytes: 300 byte tokens
    (tmp_path / "books" / "b.txt").write_text("term " * 20)
    return tmp_path / "books"


def test_ppl_lengths_max_tokens_and_unreached_buckets(tmp_path, books, capsys):
    base = ["ppl", "--books", str(books), "--synthetic.train_steps=1", "--ppl.segment_tokens=64"]
    assert main([*base, "--lengths", "64,256", "--max-tokens", "128", "--out", str(tmp_path / "x")]) == 2
    assert "--max-tokens 128 is below the largest --lengths bucket 256" in capsys.readouterr().err
    assert main([*base, "--lengths", "64,512", "--out", str(tmp_path / "x")]) == 2
    assert "no book reaches --lengths bucket(s) 512: the longest, 'a.txt', has 300 tokens" in capsys.readouterr().err

    assert main([*base, "--lengths", "64,256,512", "--allow-skip", "--out", str(tmp_path / "ok")]) == 0
    res = json.loads((tmp_path / "ok" / "results.json").read_text())
    assert [s["bucket"] for s in res["skipped"]] == [512]
    buckets = res["protocols"]["cached"]["buckets"]  # b.txt ends inside [64, 256), a.txt inside [256, 512)
    assert [(b["books"], b["tokens"]) for b in buckets] == [(2, 128), (2, 192 + 36), (1, 44)]
    assert [book["tokens"] for book in res["books"]] == [300, 100]  # every book to its end: nothing capped
