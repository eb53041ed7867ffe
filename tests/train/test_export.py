"""`evalm export`: a DCP checkpoint becomes safetensors + config.json + tokenizer.

    python -m pytest tests/train/test_export.py -q

Oracle: PyTorch's own DCP reader (`dcp_to_torch_save`), which shares no code with our export.
"""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from evalm.io import load_model
from evalm.launcher.cli import main as evalm
from tests.train.helpers import tiny_run_file, write_shards
from evalm.train import checkpoint
from evalm.train.cli import main as train_cli


def test_export_equals_torch_reading_of_the_checkpoint(tmp_path):
    shards = tmp_path / "shards"
    write_shards(shards)
    (shards / "tokenizer.json").write_text("{}")  # stands for the tokenizer the shards were written with
    run = tiny_run_file(tmp_path / "run.toml", shards, steps=2, save_every=2)
    assert train_cli(["pretrain", "--config", str(run), "--out", str(tmp_path / "out")]) == 0
    step = checkpoint.complete_checkpoints(tmp_path / "out")[-1]

    assert evalm(["export", "--checkpoint", str(tmp_path / "out"), "--out", str(tmp_path / "model")]) == 0
    dcp_to_torch_save(str(step), str(tmp_path / "ref.pt"))
    reference = torch.load(tmp_path / "ref.pt", weights_only=True)["model"]
    exported = load_file(tmp_path / "model" / "model.safetensors")
    assert exported.keys() <= reference.keys() and len(exported) >= len(reference) - 1  # tied lm_head stored once
    for name, tensor in exported.items():
        assert torch.equal(tensor, reference[name]), name

    model = load_model(tmp_path / "model")
    assert model.config.vocab_size == json.loads((step / "config.json").read_text())["model"]["vocab_size"]
    assert (tmp_path / "model" / "tokenizer.json").read_text() == "{}"
    assert not model.training


def test_export_of_a_folder_without_checkpoints_is_a_clear_error(tmp_path, capsys):
    assert evalm(["export", "--checkpoint", str(tmp_path), "--out", str(tmp_path / "m")]) == 2
    assert "complete checkpoint" in capsys.readouterr().err
