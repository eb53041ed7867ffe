"""Hugging Face folders checked like our own exports (issue "Hostile inputs, third round", item 6).

    python -m pytest tests/hostile/test_hf_folders.py -q

A tiny Llama folder is built here and edited as a careless or hostile user would: the safetensors
header's dtype changed from F32 to I32 (converted without a word: q_proj values of 1.2e9), a layer
more or fewer in config.json than in the weights (a random layer added, or one dropped, and written
by `evalm convert`), a hidden size or vocabulary that the weights do not have, a config.json that is
not JSON or is gone, a safetensors file cut short or with a crafted header, a tokenizer.json of
garbage or nested past its reader, a `--gguf-file` outside the folder, not a GGUF, a FIFO or with
counts of 2^62. Each is one line naming the file (exit 2), never a `bug:` line, and `convert` writes
nothing for any of them.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from tests.hostile.conftest import one_line, refused_in_process
from tests.hostile.hf_folders import copy, edit_json, header, llama, write_header
from tests.hostile.limits import evalm, user_error
from tests.models import two_label_task

pytest.importorskip("transformers")

ICL = ["--shots", "0", "--seeds", "1", "--methods", "concat"]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return llama(tmp_path_factory.mktemp("hf") / "llama")


def convert(folder: Path, out: Path, *extra: str) -> int:
    from evalm.train.convert import main

    return main(["--hf-model", str(folder), "--out", str(out), *extra])


def icl(folder: Path, tmp_path: Path, *extra: str) -> int:
    from evalm.icl_eval.cli import main

    return main(["icl", "--hf-model", str(folder), "--task", str(two_label_task(tmp_path / "task")), *ICL,
                 "--out", str(tmp_path / "icl"), *extra])


def refused_by_both(folder: Path, tmp_path: Path, capsys) -> str:
    """The one line of `convert` and of `eval icl --hf-model` on `folder` (the same), nothing converted."""
    lines = []
    for command in (lambda: convert(folder, tmp_path / "eva"), lambda: icl(folder, tmp_path)):
        capsys.readouterr()
        assert command() == 2
        lines.append(one_line(capsys.readouterr().err).split(": error: ", 1)[1])
    assert lines[0] == lines[1], lines
    assert not (tmp_path / "eva").exists()
    return lines[0]


def test_a_dtype_edited_in_the_header_is_refused(source, tmp_path, capsys):
    folder = copy(source, tmp_path / "llama")
    value, rest = header(folder / "model.safetensors")
    value["model.layers.0.self_attn.q_proj.weight"]["dtype"] = "I32"
    write_header(folder / "model.safetensors", value, rest)
    line = refused_by_both(folder, tmp_path, capsys)  # was: rc 0, q_proj values of 1.2e9
    assert f"{folder / 'model.safetensors'}: tensor model.layers.0.self_attn.q_proj.weight is stored as I32, not " \
        "floating point" in line, line


@pytest.mark.parametrize("layers, said", [(3, "num_hidden_layers 3, but the weights hold 2 layer(s)"),
                                          (1, "9 tensor(s) config.json has no place for (model.layers.1.")])
def test_a_layer_more_or_fewer_than_the_weights_is_refused(source, tmp_path, capsys, layers, said):
    folder = copy(source, tmp_path / "llama")
    edit_json(folder / "config.json", num_hidden_layers=layers)
    line = refused_by_both(folder, tmp_path, capsys)  # was: a random layer added, or one dropped, and converted
    assert f"{folder / 'config.json'} does not describe {folder / 'model.safetensors'}" in line and said in line, line


@pytest.mark.parametrize("key, value, said", [
    ("hidden_size", 48, "shapes differ (model.embed_tokens.weight: weights (64, 32), config.json (64, 48)"),
    ("vocab_size", 80, "shapes differ (model.embed_tokens.weight: weights (64, 32), config.json (80, 32)"),
])
def test_a_shape_the_weights_do_not_have_is_refused(source, tmp_path, capsys, key, value, said):
    folder = copy(source, tmp_path / "llama")
    edit_json(folder / "config.json", **{key: value, "head_dim": 8})
    line = refused_by_both(folder, tmp_path, capsys)
    assert said in line, line


def test_a_tensor_missing_from_the_weights_is_refused(source, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    folder = copy(source, tmp_path / "llama")
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    line = refused_by_both(folder, tmp_path, capsys)
    assert "1 tensor(s) missing (model.layers.1.mlp.up_proj.weight)" in line, line


@pytest.mark.parametrize("damage, said", [
    ("not-json", "config.json: not valid JSON (line 1, column"),
    ("missing", "config.json: not found; a Hugging Face model folder holds config.json"),
    ("list", "config.json: a JSON list, not the object a model's config is"),
    ("truncated", "model.safetensors: damaged or truncated safetensors file"),
    ("crafted", "model.safetensors: damaged or truncated safetensors file"),
])
def test_a_damaged_config_or_weights_file_is_one_line(source, tmp_path, capsys, damage, said):
    folder = copy(source, tmp_path / "llama")
    weights = folder / "model.safetensors"
    if damage == "not-json":
        (folder / "config.json").write_text('{"model_type": "llama",')
    elif damage == "missing":
        (folder / "config.json").unlink()
    elif damage == "list":
        (folder / "config.json").write_text("[1, 2]")
    elif damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:-100])
    else:  # a header whose offsets reach past the file
        value, rest = header(weights)
        value["model.norm.weight"]["data_offsets"] = [0, 1 << 40]
        write_header(weights, value, rest)
    line = refused_by_both(folder, tmp_path, capsys)
    assert said in line, line


@pytest.mark.parametrize("content", ["garbage", "nested"])
def test_a_tokenizer_that_does_not_load_is_one_line(source, tmp_path, capsys, content):
    folder = copy(source, tmp_path / "llama")
    text = "\x00\x01 not a tokenizer" if content == "garbage" else '{"model": ' + "[" * 5000 + "]" * 5000 + "}"
    (folder / "tokenizer.json").write_text(text)
    line = refused_by_both(folder, tmp_path, capsys)
    assert f"{folder}: its tokenizer does not load (" in line, line


def _gguf(path: Path, tensors: int = 1, kv: int = 0, tail: bytes = bytes(64)) -> Path:
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, tensors, kv) + tail)
    return path


@pytest.mark.parametrize("case", ["outside", "absolute", "link-out", "not-gguf", "counts", "string",
                                  pytest.param("fifo", marks=pytest.mark.slow)])  # fifo: ~18 s on 2 cores
def test_a_gguf_file_is_inside_the_folder_regular_and_bounded(source, tmp_path, case):
    folder = copy(source, tmp_path / "llama")
    secret = tmp_path / "secret.gguf"
    _gguf(secret)
    name = {"outside": "../secret.gguf", "absolute": str(secret), "link-out": "link.gguf"}.get(case, "model.gguf")
    if case == "link-out":
        (folder / "link.gguf").symlink_to(secret)
    elif case == "not-gguf":
        (folder / name).write_text("just text\n" * 10)
    elif case == "fifo":
        os.mkfifo(folder / name)
    elif case == "counts":
        _gguf(folder / name, tensors=1 << 62)
    elif case == "string":  # one key whose length claims 2^62 bytes
        _gguf(folder / name, tensors=0, kv=1, tail=struct.pack("<Q", 1 << 62) + bytes(32))
    said = {"not-gguf": f"{folder / name}: not a GGUF file", "fifo": f"{folder / name}: a FIFO (named pipe), not a "
            "regular file", "counts": f"{folder / name}: the tensor count is 4611686018427387904, more than",
            "string": f"{folder / name}: the length of key 0 is 4611686018427387904, more than"}.get(
        case, f"--gguf-file {name}: not a file inside --hf-model {folder}")
    for argv in (["convert", "--hf-model", folder, "--gguf-file", name, "--out", tmp_path / "eva"],
                 ["eval", "icl", "--hf-model", folder, "--gguf-file", name, "--task", two_label_task(tmp_path / "t"),
                  *ICL, "--out", tmp_path / "o"]):
        # was: ../../etc/passwd opened, a FIFO hung (so that case runs in its own process, under a time limit),
        # 2^62 counts a MemoryError or IndexError reported as a bug
        line = user_error(evalm(*argv, timeout=120)) if case == "fifo" else refused_in_process(argv)
        assert said in line, line
