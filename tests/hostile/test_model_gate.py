"""A model folder's weights and config.json through the one gate (issue "Hostile inputs, fourth round").

    python -m pytest tests/hostile/test_model_gate.py -q

A tiny Llama folder is built here and edited as a hostile or careless user would:
- a `model.safetensors.index.json` naming a shard by absolute path, with `/`, or `..` (the reader dropped such
  names, `transformers` opened them anyway: another file's tensors converted), or a FIFO (`convert` hung);
- `.bin` weights or a GGUF file whose config claims 100,000 layers (the model was built while memory grew);
- a GGUF tensor that runs past the file's end;
- config.json sizes that are negative, zero, floats or strings, an unknown `rope_scaling`, no weights at all.
Each is one line naming the file (exit 2), never a `bug:` line or a hang, and nothing is converted.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest

from tests.hostile.hf_folders import copy, edit_json, llama
from tests.hostile.test_hf_folders import ICL, refused_by_both
from tests.hostile.limits import evalm, user_error
from tests.models import two_label_task

pytest.importorskip("transformers")

@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return llama(tmp_path_factory.mktemp("gate") / "llama")


def sharded(source: Path, folder: Path, name: str) -> Path:
    """`source` with its weights as an index whose every tensor is in `model-00001.safetensors`, and
    `model.norm.weight` mapped to shard `name`."""
    folder = copy(source, folder)
    (folder / "model.safetensors").rename(folder / "model-00001.safetensors")
    from safetensors import safe_open

    with safe_open(str(folder / "model-00001.safetensors"), framework="pt") as f:
        names = list(f.keys())
    weight_map = {n: "model-00001.safetensors" for n in names} | {"model.norm.weight": name}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


@pytest.mark.parametrize("kind", ["absolute", "slash", "dotdot"])
def test_a_shard_named_outside_the_folder_is_refused(source, tmp_path, capsys, kind):
    import torch
    from safetensors.torch import save_file

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    save_file({"model.norm.weight": torch.full((32,), 7.0)}, str(outside / "evil.safetensors"))
    name = {"absolute": str(outside / "evil.safetensors"), "slash": "sub/evil.safetensors",
            "dotdot": "../elsewhere/evil.safetensors"}[kind]
    folder = sharded(source, tmp_path / "llama", name)
    if kind == "slash":
        (folder / "sub").mkdir()
        shutil.copy(outside / "evil.safetensors", folder / "sub")
    line = refused_by_both(folder, tmp_path, capsys)  # was: the 7s converted as the model's final norm
    assert f"{folder / 'model.safetensors.index.json'}: shard {name!r} is not a plain file name" in line, line


def test_a_shard_that_is_a_fifo_is_refused_not_waited_on(source, tmp_path):
    os.mkfifo(tmp_path / "pipe.safetensors")
    folder = sharded(source, tmp_path / "llama", str(tmp_path / "pipe.safetensors"))
    line = user_error(evalm("convert", "--hf-model", folder, "--out", tmp_path / "eva", timeout=120))  # was: a hang
    assert "model.safetensors.index.json: shard" in line, line
    assert not (tmp_path / "eva").exists()


@pytest.mark.parametrize("layers", [100_000, pytest.param(1000, marks=pytest.mark.slow)])  # 1000: ~15 s on 2 cores
def test_bin_weights_under_a_config_of_more_layers_are_refused_before_a_model_is_built(source, tmp_path, layers):
    import torch
    from safetensors.torch import load_file

    folder = copy(source, tmp_path / "llama")
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    edit_json(folder / "config.json", num_hidden_layers=layers)
    line = user_error(evalm("convert", "--hf-model", folder, "--out", tmp_path / "eva", timeout=120))  # was: a hang
    said = {100_000: f"{folder / 'config.json'}: num_hidden_layers 100000: a size must be a whole number from 1 to",
            1000: f"{folder / 'config.json'} does not describe {folder / 'pytorch_model.bin'}: num_hidden_layers 1000, "
                  "but the weights hold 2 layer(s)"}[layers]  # 1000 is inside the range: the weights refuse it
    assert said in line, line


def test_bin_weights_that_fit_their_config_still_convert(source, tmp_path):
    import torch
    from safetensors.torch import load_file

    from evalm.train.convert import main

    folder = copy(source, tmp_path / "llama")
    torch.save(load_file(folder / "model.safetensors"), folder / "pytorch_model.bin")
    (folder / "model.safetensors").unlink()
    assert main(["--hf-model", str(folder), "--out", str(tmp_path / "eva")]) == 0


def gguf(path: Path, kv: dict, tensors: list[tuple[str, list[int], int]], data: bytes, alignment: int = 32) -> Path:
    """A GGUF v3 file: `kv` (name -> u32 or string), tensors (name, dims, ggml type) at consecutive offsets."""
    def string(text: str) -> bytes:
        return struct.pack("<Q", len(text.encode())) + text.encode()

    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    for key, value in kv.items():
        out += string(key) + (struct.pack("<I", 8) + string(value) if isinstance(value, str)
                              else struct.pack("<II", 4, value))
    offset = 0
    for name, dims, kind in tensors:
        out += string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", kind, offset)
        n = 4
        for d in dims:
            n *= d
        offset += n + (-n % alignment)
    out += bytes(-len(out) % alignment)
    path.write_bytes(out + data)
    return path


BLOCKS = [("token_embd.weight", [8, 16], 0), ("blk.0.attn_q.weight", [8, 8], 0), ("output_norm.weight", [8], 0)]


@pytest.mark.parametrize("case", ["blocks", "past-end"])
def test_a_gguf_whose_header_claims_more_than_it_holds_is_one_line(source, tmp_path, case):
    from tests.hostile.conftest import refused_in_process

    folder = copy(source, tmp_path / "llama")
    blocks = 100_000 if case == "blocks" else 1
    size = sum(4 * (d[0] * (d[1] if len(d) > 1 else 1)) for _, d, _ in BLOCKS)
    data = bytes(size + 64) if case == "blocks" else bytes(100)  # past-end: the first tensor alone needs 512 bytes
    gguf(folder / "model.gguf", {"general.architecture": "llama", "llama.block_count": blocks}, BLOCKS, data)
    said = {"blocks": f"{folder / 'model.gguf'}: llama.block_count 100000, but the file holds tensors of 1 block(s)",
            "past-end": f"{folder / 'model.gguf'}: tensor 'token_embd.weight' runs past the end of the file"}[case]
    for argv in (["convert", "--hf-model", folder, "--gguf-file", "model.gguf", "--out", tmp_path / "eva"],
                 ["eval", "icl", "--hf-model", folder, "--gguf-file", "model.gguf", "--task",
                  two_label_task(tmp_path / "t"), *ICL, "--out", tmp_path / "o"]):
        line = refused_in_process(argv)  # was: a bug line past the end, a hang with 100,000 blocks
        assert said in line, line


@pytest.mark.parametrize("key, value, said", [
    ("hidden_size", -32, "hidden_size -32: a size must be a whole number from 1 to"),
    ("hidden_size", 0, "hidden_size 0: a size must be a whole number from 1 to"),
    ("hidden_size", 32.5, "hidden_size 32.5: a size must be a whole number from 1 to"),
    ("num_attention_heads", "4", "num_attention_heads '4': a size must be a whole number from 1 to"),
    ("num_hidden_layers", 0, "num_hidden_layers 0: a size must be a whole number from 1 to"),
    ("vocab_size", True, "vocab_size True: a size must be a whole number from 1 to"),
    ("intermediate_size", 1 << 40, "intermediate_size 1099511627776: a size must be a whole number from 1 to"),
    ("rope_scaling", {"rope_type": "bogus", "factor": 2.0}, "rope_scaling: rope type 'bogus' is not one of"),
    ("rope_scaling", "linear", "rope_scaling: 'linear' is not a table"),
])
def test_a_bad_size_in_config_json_is_one_line_naming_the_file_and_key(source, tmp_path, capsys, key, value, said):
    folder = copy(source, tmp_path / "llama")
    edit_json(folder / "config.json", **{key: value})
    line = refused_by_both(folder, tmp_path, capsys)
    assert line.startswith(f"{folder / 'config.json'}: ") and said in line, line


def test_a_folder_without_weights_is_one_line(source, tmp_path, capsys):
    folder = copy(source, tmp_path / "llama")
    (folder / "model.safetensors").unlink()
    line = refused_by_both(folder, tmp_path, capsys)
    assert f"{folder}: no weights (model.safetensors" in line, line
