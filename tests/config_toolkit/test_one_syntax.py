"""One override syntax across `evalm`: `--set SECTION.KEY=VALUE` everywhere, `--SECTION.KEY=VALUE`
its alias; and every settable key listed by `--help` with its default."""

from __future__ import annotations

import dataclasses
import json

import pytest

from evalm.config_toolkit import ConfigError, split_overrides
from tests.models import byte_model, two_label_task


def test_set_and_dotted_forms_are_one_override():
    assert split_overrides(["--set", "eval.seeds=[1]", "--set=ppl.max_books=2", "--eval.bos=none", "--out", "x"]) == \
        (["eval.seeds=[1]", "ppl.max_books=2", "eval.bos=none"], ["--out", "x"])
    with pytest.raises(ConfigError, match="--set needs SECTION.KEY=VALUE"):
        split_overrides(["--set"])


def test_evaluation_takes_set_like_training(tmp_path, capsys):
    """The same settings through either spelling: results.json's recorded settings are equal."""
    from evalm.icl_eval.cli import main

    model, task = byte_model(tmp_path / "model"), two_label_task(tmp_path / "task")
    recorded = []
    for i, spelling in enumerate((["--set", "eval.separator=eos"], ["--eval.separator=eos"])):
        out = tmp_path / f"o{i}"
        assert main(["icl", "--checkpoint", str(model), "--task", str(task), "--methods",
                     "concat", "--shots", "0,1", "--seeds", "1", *spelling, "--out", str(out)]) == 0
        recorded.append(json.loads((out / "results.json").read_text())["protocol"]["eval"]["separator"])
    assert recorded == ["eos", "eos"]


def test_training_takes_the_dotted_alias(tmp_path):
    from evalm.train.command import TrainCommand, parse_run_args
    from tests.train.helpers import tiny_run_file, write_shards

    write_shards(tmp_path / "tokens")
    run_file = tiny_run_file(tmp_path / "run.toml", tmp_path / "tokens")
    both = [parse_run_args(["--config", str(run_file), *form], TrainCommand("t"))[0]
            for form in (["--set", "train.steps=3"], ["--train.steps=3"])]
    assert both[0] == both[1] and both[0].train.steps == 3


@pytest.mark.parametrize("argv, sections", [
    (["eval", "icl"], ("eval", "eval.method", "model", "synthetic")),
    (["eval", "ppl"], ("ppl", "model", "synthetic")),
    (["train", "pretrain"], ("model", "data", "optim", "train", "checkpoint")),
])
def test_help_lists_every_settable_key_with_its_default(argv, sections, capsys):
    from evalm.launcher.cli import main

    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    text = capsys.readouterr().out
    from evalm.config import ModelConfig
    from evalm.icl_eval.config import EvalConfig, PerplexityConfig
    from evalm.icl_eval.methods.options import MethodOptions
    from evalm.text.synthetic import SyntheticConfig
    from evalm.train.config import CheckpointConfig, DataConfig, OptimConfig, TrainConfig

    classes = {"eval": EvalConfig, "eval.method": MethodOptions, "ppl": PerplexityConfig, "model": ModelConfig,
               "synthetic": SyntheticConfig, "data": DataConfig, "optim": OptimConfig, "train": TrainConfig,
               "checkpoint": CheckpointConfig}
    missing = [f"{s}.{f.name}" for s in sections for f in dataclasses.fields(classes[s]) if f"  {s}.{f.name} = " not in text]
    assert missing == []
    assert "  eval.calibration = 'none'" in text or "eval" not in sections
