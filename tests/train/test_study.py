"""What a study needs beside its measurements, in the commands that own each noun: `evalm convert --widen`
against a fresh conversion, `evalm export --digest` against the file's own bytes, a run's config rebuilt from
its folder, `evalm train uptrain --export-trainables` / `--rebuild`, `evalm convert --prepare`; and the earlier
`evalm study ...` spellings giving the same results.

    pytest tests/train/test_study.py
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct

import pytest
import torch

transformers = pytest.importorskip("transformers")

from evalm.launcher.cli import main as evalm  # noqa: E402
from evalm.storage import weights_digest  # noqa: E402
from tests.train.llama_helpers import converted_tiny, tiny_llama_folder, uptrain_file  # noqa: E402

TORCH_DTYPES = {"F64": "torch.float64", "F32": "torch.float32", "F16": "torch.float16", "BF16": "torch.bfloat16"}


def file_digest(path) -> str:
    """The digest read straight from the safetensors layout (8-byte header length, JSON header, raw bytes):
    an oracle that shares no code with safetensors or torch."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    digest = hashlib.sha256()
    for name in sorted(header):
        entry = header[name]
        begin, end = entry["data_offsets"]
        digest.update(f"{name} {TORCH_DTYPES[entry['dtype']]} {tuple(entry['shape'])}".encode())
        digest.update(data[8 + n + begin:8 + n + end])
    return digest.hexdigest()


def load(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float64).eval()


def logits(folder, x):
    with torch.no_grad():
        return load(folder)(x).logits


def old_widen(src, dst, window):
    """benchmarks/convert.py's `widen` before it moved: the folder copied, config.json edited by hand."""
    config = json.loads((src / "config.json").read_text())
    config["evalm"]["window_size"] = window
    shutil.copytree(src, dst, dirs_exist_ok=True)
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """The tiny Llama converted at w = 8 and at w = 32 (c = 4), float64."""
    from evalm.train.convert import main as convert

    root = tmp_path_factory.mktemp("widen")
    source = tiny_llama_folder(root / "llama")
    for w in (8, 32):
        assert convert(["--hf-model", str(source), "--out", str(root / f"w{w}"), "--dtype", "float64",
                        "--set", f"eva.window_size={w}", "--set", "eva.chunk_size=4"]) == 0
    return root


def test_a_widened_folder_is_a_fresh_conversion_at_the_wide_window(twins, tmp_path):
    x = torch.randint(0, 63, (2, 32), generator=torch.Generator().manual_seed(0))
    assert evalm(["convert", "--widen", "--hf-model", str(twins / "w8"), "--out", str(tmp_path / "wide"), "--window", "32"]) == 0
    wide, fresh, narrow = logits(tmp_path / "wide", x), logits(twins / "w32", x), logits(twins / "w8", x)
    assert torch.equal(wide, fresh)  # the same weights, the same computation: bit for bit
    assert (wide - narrow).abs().max() > 1e-3  # w = 8 reads summaries past its first block: widening changed it
    assert weights_digest(tmp_path / "wide") == weights_digest(twins / "w8")
    old_widen(twins / "w8", tmp_path / "old", 32)  # what the script wrote: the same model
    assert torch.equal(logits(tmp_path / "old", x), wide)
    new, old = (load(f).config.to_dict() for f in (tmp_path / "wide", tmp_path / "old"))
    assert {k: v for k, v in new.items() if k not in ("transformers_version", "_name_or_path")} == \
        {k: v for k, v in old.items() if k not in ("transformers_version", "_name_or_path")}


def test_a_window_the_chunks_do_not_divide_is_refused(twins, tmp_path, capsys):
    assert evalm(["convert", "--widen", "--hf-model", str(twins / "w8"), "--out", str(tmp_path / "bad"), "--window", "30"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "window_size=30 must be a positive multiple of" in err and "chunk_size=4" in err
    assert not (tmp_path / "bad" / "config.json").exists()
    assert evalm(["convert", "--widen", "--hf-model", str(tmp_path / "none"), "--out", str(tmp_path / "x"), "--window", "32"]) == 2
    assert "none: no config.json" in capsys.readouterr().err


def test_the_weights_digest_is_the_tensors_bytes_whatever_the_metadata(twins, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    folder = twins / "w8"
    assert weights_digest(folder) == file_digest(folder / "model.safetensors")
    tensors = load_file(folder / "model.safetensors")
    (tmp_path / "a").mkdir()
    save_file(tensors, tmp_path / "a" / "model.safetensors", metadata={"written": "elsewhere"})
    assert (tmp_path / "a" / "model.safetensors").read_bytes() != (folder / "model.safetensors").read_bytes()
    assert weights_digest(tmp_path / "a") == weights_digest(folder)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].clone()
    tensors[name].view(-1)[0] += 1
    save_file(tensors, tmp_path / "a" / "model.safetensors")
    assert weights_digest(tmp_path / "a") == file_digest(tmp_path / "a" / "model.safetensors") != weights_digest(folder)
    assert evalm(["export", "--digest", str(folder)]) == 0
    assert capsys.readouterr().out.strip() == f"weights sha256 {file_digest(folder / 'model.safetensors')}"


def test_the_weights_digest_reads_tensors_not_the_files_metadata(tmp_path):
    """The same tensors under other file metadata give one digest (two machines, two save_pretrained); one
    changed value, or a renamed tensor, another."""
    import torch
    from safetensors.torch import save_file

    tensors = {"b": torch.arange(6.0).reshape(2, 3), "a": torch.ones(4, dtype=torch.bfloat16)}

    def digest(name, tensors, metadata):
        (tmp_path / name).mkdir()
        save_file(tensors, str(tmp_path / name / "model.safetensors"), metadata=metadata)
        return weights_digest(tmp_path / name)

    first = digest("one", tensors, {"format": "pt"})
    assert digest("two", dict(reversed(tensors.items())), {"format": "pt", "saved_by": "elsewhere"}) == first
    assert digest("three", {**tensors, "b": tensors["b"] + torch.eye(2, 3) * 1e-6}, None) != first
    assert digest("four", {"c": tensors["b"], "a": tensors["a"]}, None) != first


def test_a_run_comes_home_as_its_trainables_and_is_rebuilt_there(tmp_path, capsys):
    """`evalm train uptrain --export-trainables` there, `--rebuild` here (the converted folder at another path):
    the run's own OUT/hf, digest for digest; the run's config read back from its folder is its run file's."""
    from evalm.train.uptrain import load_config, main as uptrain, run_config

    _, eva, shards = converted_tiny(tmp_path)
    run = uptrain_file(tmp_path / "run.toml", eva, shards, parameters="lora", objective="lm", steps=3)
    assert uptrain(["--config", str(run), "--out", str(tmp_path / "there")]) == 0
    assert evalm(["train", "uptrain", "--export-trainables", "--out", str(tmp_path / "there")]) == 0
    home = tmp_path / "home"
    shutil.copytree(tmp_path / "there", home, ignore=shutil.ignore_patterns("checkpoints", "step-*", "hf"))
    shutil.copytree(eva, tmp_path / "eva-here")
    shutil.rmtree(eva)  # the recorded path is gone: only --hf-model finds the converted folder
    assert run_config(home, tmp_path / "eva-here") == load_config(run, [f"model.hf_model={tmp_path / 'eva-here'}"])
    capsys.readouterr()
    assert evalm(["train", "uptrain", "--rebuild", "--out", str(home), "--hf-model", str(tmp_path / "eva-here")]) == 0
    assert capsys.readouterr().out.strip().endswith(f"weights sha256 {weights_digest(tmp_path / 'there' / 'hf')}")
    assert file_digest(home / "hf" / "model.safetensors") == weights_digest(tmp_path / "there" / "hf")


def test_a_folder_that_is_no_run_is_one_line(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text('{"model": {}}')
    assert evalm(["train", "uptrain", "--export-trainables", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no ['data', 'optim', 'train', 'checkpoint', 'uptrain'] section(s)" in err


def test_prepare_writes_a_llama_folder_as_the_same_float32_weights_once(tmp_path, capsys):
    """`evalm convert --prepare --hf-model DIR`: a transformers folder read through evalm.hf_folder and written as a plain
    float32 folder whose tensors are the source's (the digest read from the files' bytes); a second run keeps it;
    an output inside the source is refused in one line."""
    source = tiny_llama_folder(tmp_path / "llama", dtype="float32")
    out = tmp_path / "prepared"
    assert evalm(["convert", "--prepare", "--hf-model", str(source), "--out", str(out)]) == 0
    assert file_digest(out / "model.safetensors") == file_digest(source / "model.safetensors")
    assert (out / "tokenizer.json").is_file() and not list(out.glob(".staging-*"))
    stamp = (out / "model.safetensors").stat().st_mtime_ns
    assert evalm(["convert", "--prepare", "--hf-model", str(source), "--out", str(out)]) == 0
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    capsys.readouterr()
    assert evalm(["convert", "--prepare", "--hf-model", str(source), "--out", str(source / "inside")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_the_earlier_study_spellings_give_what_the_new_ones_give(twins, tmp_path, capsys):
    """`evalm study widen|digest|prepare` forward to `evalm convert --widen`, `evalm export --digest`, `evalm convert
    --prepare`: the same folders, file for file (but the made-by marker's time and the recorded --out), the same
    lines printed."""
    def files(folder):
        return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()
                and p.name not in (".evalm-folder.json", ".evalm.lock", ".evalm-digests.json")}

    old = ["study", "widen", "--model", str(twins / "w8"), "--window", "32", "--out"]
    new = ["convert", "--widen", "--hf-model", str(twins / "w8"), "--window", "32", "--out"]
    assert evalm([*old, str(tmp_path / "old")]) == 0 and evalm([*new, str(tmp_path / "new")]) == 0
    assert files(tmp_path / "old") == files(tmp_path / "new")
    capsys.readouterr()
    assert evalm(["study", "digest", str(twins / "w8")]) == 0 and evalm(["export", "--digest", str(twins / "w8")]) == 0
    first, second = capsys.readouterr().out.strip().splitlines()
    assert first == second and first.startswith("weights sha256 ")
    source = tiny_llama_folder(tmp_path / "llama", dtype="float32")
    assert evalm(["study", "prepare", "--source", str(source), "--out", str(tmp_path / "p-old")]) == 0
    assert evalm(["convert", "--prepare", "--hf-model", str(source), "--out", str(tmp_path / "p-new")]) == 0
    assert files(tmp_path / "p-old") == files(tmp_path / "p-new")
