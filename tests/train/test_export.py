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


def test_the_same_weights_are_the_same_bytes(tmp_path):
    """safetensors writes its metadata in hash-map order; `save_model` sorts it, so identical weights give one
    file and one SHA-256 identity (the resume keys of the evaluations are built on it). Oracle: the bytes of
    eight saves, and the tensors and metadata read back by safetensors itself."""
    import hashlib

    from safetensors import safe_open

    from evalm import EvalmModel, ModelConfig
    from evalm.io import save_model

    model = EvalmModel(ModelConfig(vocab_size=257, d_model=16, n_layer=1, n_head=2, d_ff=32, window_size=8,
                                   chunk_size=4, circular_period=64))
    model.init_weights()
    files = [save_model(model, tmp_path / str(i)) / "model.safetensors" for i in range(8)]
    assert len({hashlib.sha256(f.read_bytes()).hexdigest() for f in files}) == 1
    with safe_open(str(files[0]), "pt") as f:
        assert sorted(f.metadata()) == ["evalm.model", "format", "lm_head.weight"]
    back = load_model(files[0].parent)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), back.state_dict().values()))
