"""The study's commands under the folder rules every other command follows (`storage.RunFolder`): what
`evalm study prepare|widen|trainables|rebuild|digest` (now `evalm convert --prepare|--widen`, `evalm train
uptrain --export-trainables|--rebuild`, `evalm export --digest`) overwrote, followed or ended as `bug:` on.

    python -m pytest tests/hostile/test_study_commands.py -q

Each test drives the old spelling, which scripts still call (it forwards to the new command), on a tiny
Llama converted here: nothing written over an input or another command's folder, nothing through a link,
nothing from broken tensors, a stale prepared folder refused, damaged files and wrong paths one line.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.hostile.conftest import one_line, refused_in_process
from tests.train.llama_helpers import converted_tiny, tiny_llama_folder, uptrain_file

pytest.importorskip("transformers")


def evalm(*argv) -> int:
    from evalm.launcher.cli import main

    return main([str(a) for a in argv])


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (links not followed) with its bytes, but its lock and digest cache (a folder's
    bookkeeping, rewritten by whoever holds it): what must stay as it was."""
    from evalm.storage.run_folder import DIGESTS
    from evalm.storage.lock import LOCK_FILE

    return {str(p.relative_to(folder)): (b"link:" + os.readlink(p).encode() if p.is_symlink() else p.read_bytes())
            for p in sorted(folder.rglob("*")) if (p.is_symlink() or p.is_file()) and p.name not in (DIGESTS, LOCK_FILE)}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(converted folder, a finished LoRA run of 3 steps with its trainables file and OUT/hf)."""
    root = tmp_path_factory.mktemp("study-commands")
    _, eva, shards = converted_tiny(root)
    from evalm.train.uptrain import main as uptrain

    config = uptrain_file(root / "run.toml", eva, shards, parameters="lora", objective="lm", steps=3)
    assert uptrain(["--config", str(config), "--out", str(root / "run")]) == 0
    assert evalm("study", "trainables", "--run", root / "run") == 0
    return eva, root / "run"


def test_trainables_never_writes_over_a_file_it_did_not_make(run, tmp_path):
    eva, out = run
    before = tree(eva)
    line = refused_in_process(["study", "trainables", "--run", out, "--trainables", eva / "model.safetensors"])
    assert "lies inside" in line and tree(eva) == before  # was: the converted model's weights replaced
    (tmp_path / "notes.txt").write_text("mine")
    line = refused_in_process(["study", "trainables", "--run", out, "--trainables", tmp_path / "notes.txt"])
    assert "is no trainables file" in line and (tmp_path / "notes.txt").read_text() == "mine"
    config = (out / "config.json").read_bytes()
    refused_in_process(["study", "trainables", "--run", out, "--trainables", out / "config.json"])
    assert (out / "config.json").read_bytes() == config
    assert evalm("study", "trainables", "--run", out) == 0  # its own file: written again


def test_widen_writes_only_a_folder_of_its_own(run, tmp_path):
    eva, out = run
    for target in (out, eva, eva / "inside"):  # a training run, its own --model, a folder inside it
        before = tree(out) if target == out else tree(eva)
        refused_in_process(["study", "widen", "--model", eva, "--out", target, "--window", "16"])
        assert (tree(out) if target == out else tree(eva)) == before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.json").write_text('{"mine": true}')
    assert "writes only into a folder it made" in refused_in_process(
        ["study", "widen", "--model", eva, "--out", mine, "--window", "16"])
    assert (mine / "config.json").read_text() == '{"mine": true}'
    assert evalm("study", "widen", "--model", eva, "--out", tmp_path / "wide", "--window", "16") == 0
    assert json.loads((tmp_path / "wide" / "config.json").read_text())["evalm"]["window_size"] == 16
    assert evalm("study", "widen", "--model", eva, "--out", tmp_path / "wide", "--window", "16") == 0  # done: kept
    assert "holds another widening" in refused_in_process(
        ["study", "widen", "--model", eva, "--out", tmp_path / "wide", "--window", "32"])
    assert evalm("convert", "--widen", "--overwrite", "--hf-model", eva, "--out", tmp_path / "wide", "--window", "32") == 0
    assert json.loads((tmp_path / "wide" / "config.json").read_text())["evalm"]["window_size"] == 32


def test_widen_keeps_the_conversion_bound_on_its_window(run, tmp_path):
    line = refused_in_process(["study", "widen", "--model", run[0], "--out", tmp_path / "w", "--window", 10**9])
    assert "--window 1000000000: at most 1048576 tokens" in line and not (tmp_path / "w").exists()


def test_widen_never_follows_a_link_in_the_folder_it_copies(run, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(run[0], model)
    (model / "loop").symlink_to(".")  # was: copied forty levels deep
    line = refused_in_process(["study", "widen", "--model", model, "--out", tmp_path / "w", "--window", "16"])
    assert f"{model / 'loop'} is a symbolic link" in line and not (tmp_path / "w" / "loop").exists()


def test_msit_data_never_writes_over_its_instructions(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"task": "t", "input": "a", "output": "b"}) + "\n")
    before = rows.read_bytes()
    for out in (rows, tmp_path / "link.jsonl"):
        if out != rows:
            os.link(rows, out)  # a hard link is the same file
        line = refused_in_process(["train", "msit-data", "--out", out, "--instructions", rows, "--episodes", "2",
                                   "--examples", "2"])
        assert "overlaps, the input --instructions" in line and rows.read_bytes() == before


def broken(trainables: Path, dest: Path, change) -> Path:
    """The run's trainables file with its metadata (its run key) kept and its tensors changed by `change`."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(trainables), framework="pt") as f:
        meta = f.metadata()
    save_file({k: change(v) for k, v in load_file(str(trainables)).items()}, str(dest), metadata=meta)
    return dest


@pytest.mark.parametrize("what", ["nan", "int32", "shape"])
def test_rebuild_refuses_broken_tensors_before_it_writes(run, tmp_path, what):
    import torch

    eva, out = run
    change = {"nan": lambda t: torch.full_like(t, float("nan")), "int32": lambda t: t.to(torch.int32),
              "shape": lambda t: t.reshape(-1)}[what]
    bad = broken(out / "trainables.safetensors", tmp_path / "bad.safetensors", change)
    before = tree(out / "hf")
    line = refused_in_process(["study", "rebuild", "--run", out, "--trainables", bad])
    assert {"nan": "NaN or infinite", "int32": "not floating point", "shape": "shape ("}[what] in line
    assert tree(out / "hf") == before  # was: a good OUT/hf replaced by a broken model


def test_a_run_folder_whose_hf_is_a_link_is_never_written_through(run, tmp_path):
    eva, out = run
    copy = tmp_path / "run"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("hf"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (copy / "hf").symlink_to(elsewhere)
    line = refused_in_process(["study", "rebuild", "--run", copy])
    assert f"{copy / 'hf'} is a symbolic link" in line and list(elsewhere.iterdir()) == []


def test_uptrains_final_export_never_writes_through_a_linked_hf(tmp_path, capsys):
    from evalm.train.uptrain import main as uptrain

    _, eva, shards = converted_tiny(tmp_path)
    config = uptrain_file(tmp_path / "run.toml", eva, shards, steps=2, save_every=2)
    out = tmp_path / "run"
    assert uptrain(["--config", str(config), "--out", str(out)]) == 0
    shutil.rmtree(out / "hf")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "hf").symlink_to(elsewhere)
    capsys.readouterr()
    assert uptrain(["--config", str(config), "--out", str(out), "--resume", "auto"]) == 2
    assert "is a symbolic link" in capsys.readouterr().err and list(elsewhere.iterdir()) == []


def test_prepare_refuses_a_folder_of_another_source(tmp_path):
    import torch

    first = tiny_llama_folder(tmp_path / "a", dtype="float32", seed=0)
    other = tiny_llama_folder(tmp_path / "b", dtype="float32", seed=1)
    out = tmp_path / "prepared"
    assert evalm("study", "prepare", "--source", first, "--out", out) == 0
    before = tree(out)
    line = refused_in_process(["study", "prepare", "--source", other, "--out", out])  # was: a's weights returned
    assert f"holds {first} prepared, not {other}" in line and tree(out) == before
    assert evalm("convert", "--prepare", "--overwrite", "--hf-model", other, "--out", out) == 0
    from safetensors.torch import load_file

    mine, theirs = (load_file(str(f / "model.safetensors")) for f in (out, other))
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)


def test_damaged_inputs_and_wrong_paths_are_one_line(run, tmp_path):
    eva, out = run
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes((out / "trainables.safetensors").read_bytes()[:200])
    assert "not a readable safetensors file" in refused_in_process(["study", "rebuild", "--run", out, "--trainables", cut])
    (tmp_path / "cut").mkdir()
    (tmp_path / "cut" / "model.safetensors").write_bytes((eva / "model.safetensors").read_bytes()[:500])
    assert "not a readable safetensors file" in refused_in_process(["study", "digest", tmp_path / "cut"])
    model = tmp_path / "list-config"
    shutil.copytree(eva, model)
    (model / "config.json").write_text("[1, 2]")
    assert "not a converted model's config" in refused_in_process(
        ["study", "widen", "--model", model, "--out", tmp_path / "w", "--window", "16"])
    (tmp_path / "file").write_text("x")
    refused_in_process(["study", "widen", "--model", eva, "--out", tmp_path / "file", "--window", "16"])
    refused_in_process(["study", "prepare", "--source", eva, "--out", tmp_path / "file"])
    assert (tmp_path / "file").read_text() == "x"
    copy = tmp_path / "run"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("hf"))
    (copy / "hf").write_text("x")  # a run's hf/ that is a file
    assert "is a file, not a folder" in refused_in_process(["study", "rebuild", "--run", copy])
    runs = tmp_path / "not-a-run"
    runs.mkdir()
    (runs / "config.json").write_text('"text"')
    refused_in_process(["study", "trainables", "--run", runs])


def test_uptraining_says_it_does_not_compile(run, tmp_path, capsys):
    from evalm.train.uptrain import main as uptrain

    eva, out = run
    run_file = uptrain_file(tmp_path / "run.toml", eva, json.loads((out / "config.json").read_text())["data"]["shards"])
    with pytest.raises(SystemExit) as stop:  # a run file's refusal exits from the parser, as training's do
        uptrain(["--config", str(run_file), "--out", str(tmp_path / "o"), "--set", "train.compile=true"])
    err = capsys.readouterr().err  # was: trained eagerly without a word
    assert stop.value.code == 2 and "compile = true is not applied by uptraining" in one_line(err)
    assert not (tmp_path / "o").exists()
