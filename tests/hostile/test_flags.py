"""A misspelled override is the flag's mistake, not the config file's (issue "Hostile inputs, third
round", item 6).

    python -m pytest tests/hostile/test_flags.py -q

`--set train.stpes=1` next to `--config run.toml` was refused as `run.toml [train]: unknown key(s)
['stpes']`: the user opened a file that is fine. Each command now checks its overrides against its
sections before merging them into the file's values, and names the override.
"""

from __future__ import annotations

import pytest

from tests.hostile.conftest import refused_in_process


def test_a_misspelled_override_names_the_flag_in_every_command(tmp_path, tiny, byte_model):
    from tests.models import two_label_task

    run_file, _ = tiny
    config = tmp_path / "eval.toml"
    config.write_text("[eval]\nseeds = [1]\n")
    task = two_label_task(tmp_path / "task")
    for argv, said in [
        (["train", "pretrain", "--config", run_file, "--out", tmp_path / "t", "--set", "train.stpes=1"],
         "--set train.stpes=1: [train]: unknown key(s) ['stpes']; valid keys: ['steps',"),
        (["train", "pretrain", "--config", run_file, "--out", tmp_path / "t", "--train.stpes=1"],
         "--set train.stpes=1: [train]: unknown key(s) ['stpes']"),
        (["eval", "icl", "--config", config, "--checkpoint", byte_model, "--task", task, "--eval.sedes=[1]",
          "--out", tmp_path / "o"], "--set eval.sedes=[1]: [eval]: unknown key(s) ['sedes']"),
        (["eval", "icl", "--config", config, "--checkpoint", byte_model, "--task", task,
          "--eval.method.scorng=answer-mean", "--out", tmp_path / "o"],
         "--set eval.method.scorng=answer-mean: [eval.method]: unknown key(s) ['scorng']"),
    ]:
        line = refused_in_process(argv)
        assert said in line, (argv, line)
        assert str(run_file) not in line and str(config) not in line, line  # was: blamed on the --config file
    assert not any((tmp_path / name).exists() for name in "to")


def test_a_misspelled_uptrain_override_names_the_flag(tmp_path):
    pytest.importorskip("transformers")
    from tests.train.helpers import write_shards
    from tests.train.llama_helpers import uptrain_file

    write_shards(tmp_path / "tokens")
    run = uptrain_file(tmp_path / "run.toml", tmp_path / "no-model", tmp_path / "tokens")
    line = refused_in_process(["train", "uptrain", "--config", run, "--out", tmp_path / "o",
                               "--set", "uptrain.objectiv=lm"])
    assert "--set uptrain.objectiv=lm: [uptrain]: unknown key(s) ['objectiv']" in line and str(run) not in line
