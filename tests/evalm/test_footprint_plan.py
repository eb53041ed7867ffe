"""The memory plan of `evalm train memory` (evalm/footprint.py), against a model actually built.

    python -m pytest tests/evalm/test_footprint_plan.py -q
"""

from __future__ import annotations

import pytest

from evalm.footprint import GiB, Shape, parameters, plan


def test_the_plans_sharded_state_is_sixteen_bytes_per_parameter_of_the_built_model_over_the_gpus(tmp_path):
    """Oracle: the parameters of the model built on the CPU (its tensors counted one by one); fp32 weights,
    gradients and AdamW's two moments are 4 + 4 + 8 bytes each, divided over the GPUs; the footprint's
    lower bound (`parameters`) never exceeds that count."""
    from evalm.model import EvalmModel

    config = tmp_path / "tiny.toml"
    config.write_text("[model]\nvocab_size = 64\nd_model = 32\nn_head = 2\nn_layer = 2\nd_ff = 64\n"
                      "window_size = 16\nchunk_size = 4\n[train]\nbatch_size = 2\n[data]\nseq_len = 64\n")
    shape = Shape.read(str(config))
    built = sum(p.numel() for p in EvalmModel(shape.model).parameters())
    for gpus in (1, 4):
        terms = dict(plan(shape, gpus))
        sharded = sum(terms[k] for k in ("fp32 parameters, sharded", "fp32 gradients, sharded",
                                         "AdamW moments (2 x fp32), sharded"))
        assert sharded == pytest.approx(16 * built / gpus)
        assert terms["runtime allowance"] == 2 * GiB
    cfg = shape.model
    assert parameters(cfg.vocab_size, cfg.d_model, cfg.n_layer, cfg.d_ff) <= built


def test_the_memory_command_prints_a_total_per_config(tmp_path, capsys):
    from evalm.train.cli import main

    assert main(["memory", "configs/pretrain-tiny.toml", "--gpus", "2"]) == 0
    out = capsys.readouterr().out
    assert "configs/pretrain-tiny.toml" in out and "total per GPU" in out and "FSDP2 over 2 GPUs" in out
