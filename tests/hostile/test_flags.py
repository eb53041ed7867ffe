"""A misspelled override is the flag's mistake, not the config file's (issue "Hostile inputs, third
round", item 6).

    python -m pytest tests/hostile/test_flags.py -q

`--set train.stpes=1` next to `--config run.toml` was refused as `run.toml [train]: unknown key(s)
['stpes']`: the user opened a file that is fine. Each command now checks its overrides against its
sections before merging them into the file's values, and names the override.
"""

from __future__ import annotations

import pytest

from tests.hostile.conftest import one_line


def _refused(argv: list, capsys) -> str:
    from evalm.launcher.cli import main

    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as stop:
        code = stop.code
    assert code == 2
    return one_line(capsys.readouterr().err)


def test_a_misspelled_override_names_the_flag_in_every_command(tmp_path, capsys, tiny, byte_model):
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
        line = _refused(argv, capsys)
        assert said in line, (argv, line)
        assert str(run_file) not in line and str(config) not in line, line  # was: blamed on the --config file
    assert not any((tmp_path / name).exists() for name in "to")


def test_a_misspelled_uptrain_override_names_the_flag(tmp_path, capsys):
    pytest.importorskip("transformers")
    from tests.train.helpers import write_shards
    from tests.train.llama_helpers import uptrain_file

    write_shards(tmp_path / "tokens")
    run = uptrain_file(tmp_path / "run.toml", tmp_path / "no-model", tmp_path / "tokens")
    line = _refused(["train", "uptrain", "--config", run, "--out", tmp_path / "o", "--set", "uptrain.objectiv=lm"],
                    capsys)
    assert "--set uptrain.objectiv=lm: [uptrain]: unknown key(s) ['objectiv']" in line and str(run) not in line
