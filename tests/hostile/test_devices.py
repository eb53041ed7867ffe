"""A device that cannot run here is the user's mistake, named in one line (issue "Hostile inputs, fourth round").

    python -m pytest tests/hostile/test_devices.py -q

`--device cuda` on a CPU build of torch ended every command that takes it as `bug: AssertionError:
Torch not compiled with CUDA enabled`, and `--device bogus` as torch's RuntimeError listing twenty
device kinds. The device is now checked where it is typed (config_toolkit/device.py): CUDA without it
names the torch build and what to install, an unknown name lists this machine's devices.
"""

from __future__ import annotations

import pytest
import torch

from tests.hostile.conftest import refused_in_process

COMMANDS = {
    "eval icl": ["eval", "icl", "--checkpoint", "model", "--task", "synthetic"],
    "eval ppl": ["eval", "ppl", "--checkpoint", "model", "--books", "books"],
    "eval recall": ["eval", "recall", "--checkpoint", "model"],
    "eval harness": ["eval", "harness", "--checkpoint", "model", "--tasks", "x"],
    "eval recall-cells": ["eval", "recall-cells", "--model", "model"],
    "train recall": ["train", "recall", "--arch", "eva", "--width", "8"],
    "train probe": ["train", "probe", "--hf-model", "model", "--shards", "shards"],
}
"""Every command with a --device flag, with the other flags it requires (none of them is read before the
device is refused)."""

CPU_BUILD = "this torch ({}) is a CPU build, without CUDA; install PyTorch's CUDA build for your CUDA version"


@pytest.mark.skipif(torch.cuda.is_available(), reason="cuda runs here")
@pytest.mark.parametrize("command", COMMANDS)
def test_cuda_on_a_cpu_build_names_the_build_and_what_to_install(command, tmp_path):
    line = refused_in_process([*COMMANDS[command], "--out", tmp_path / "o", "--device", "cuda"])
    assert f"argument --device: 'cuda': {CPU_BUILD.format(torch.__version__)}" in line, line
    assert "pip install torch --index-url https://download.pytorch.org/whl/cu" in line, line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unknown_device_lists_the_valid_ones(command, tmp_path):
    line = refused_in_process([*COMMANDS[command], "--out", tmp_path / "o", "--device", "bogus"])
    assert "argument --device: 'bogus': not a device evalm runs on; valid on this machine: cpu" in line, line
    assert not (tmp_path / "o").exists()


def test_a_device_in_a_config_file_is_checked_too(tmp_path):
    config = tmp_path / "eval.toml"
    config.write_text('[eval]\ndevice = "bogus"\n')
    line = refused_in_process(["eval", "icl", "--config", config, "--checkpoint", tmp_path / "model",
                               "--task", "synthetic", "--out", tmp_path / "o"])
    assert f"--config {config} and flags [eval]: device 'bogus': not a device evalm runs on" in line, line


@pytest.mark.skipif(torch.cuda.is_available(), reason="cuda runs here")
def test_a_training_run_on_cuda_without_it_is_refused_before_it_starts(tiny, tmp_path):
    run_file, _ = tiny  # was: bug: RuntimeError: Distributed package doesn't have NCCL built in
    line = refused_in_process(["train", "pretrain", "--config", run_file, "--out", tmp_path / "o",
                               "--set", "train.device=cuda"])
    assert f"[train] device 'cuda': {CPU_BUILD.format(torch.__version__)}" in line, line
    assert not (tmp_path / "o").exists()
