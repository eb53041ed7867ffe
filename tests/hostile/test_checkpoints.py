"""Checkpoints as hostile or broken inputs: crafted metadata, damaged files, another run's data,
non-finite training, a full disk. Each test first shows the failure it guards against where that
can be shown without harm, then that the command refuses, names the file and keeps what is intact."""

from __future__ import annotations

import json
import pickle
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from evalm.storage import write_digest
from evalm.train import checkpoint
from tests.hostile.conftest import one_line, pretrain
from tests.train.helpers import write_shards


class Plant:
    """A pickle that, when loaded by plain `pickle.load`, creates the file it names."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def _export(step_or_run: Path, out: Path) -> int:
    from evalm.train.export import main

    return main(["--checkpoint", str(step_or_run), "--out", str(out)])


def test_a_crafted_metadata_runs_nothing_and_is_named(tiny, tmp_path, capsys):
    run_file, _ = tiny
    out = tmp_path / "out"
    assert pretrain(run_file, out, "--set", "train.steps=2") == 0
    step = checkpoint.step_dir(out, 2)
    planted = tmp_path / "planted"
    (step / ".metadata").write_bytes(pickle.dumps(Plant(planted)))
    write_digest(step)  # whoever can plant the file can also re-write the digest: only the reader stands
    # the threat is real: torch's own reader runs the pickle
    from torch.distributed.checkpoint import FileSystemReader

    FileSystemReader(str(step)).read_metadata()
    assert planted.exists()
    planted.unlink()
    capsys.readouterr()

    assert _export(step, tmp_path / "exported") == 2
    line = one_line(capsys.readouterr().err)
    assert str(step / ".metadata") in line and "refused" in line and "nothing from it was run" in line
    assert pretrain(run_file, out, "--resume", "auto", "--set", "train.steps=4") == 2
    assert "none of its 1 checkpoints is intact" in one_line(capsys.readouterr().err)
    assert pretrain(run_file, tmp_path / "msit", "--set", f"checkpoint.init_from={step}") == 2
    assert str(step / ".metadata") in one_line(capsys.readouterr().err)
    assert not planted.exists()


def test_a_truncated_latest_checkpoint_resumes_from_the_previous_one_bit_exactly(tiny, tmp_path, capsys):
    run_file, _ = tiny
    reference, damaged = tmp_path / "reference", tmp_path / "damaged"
    assert pretrain(run_file, reference) == 0
    assert pretrain(run_file, damaged) == 0
    latest = checkpoint.step_dir(damaged, 6)
    shard = next(latest.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-100])
    capsys.readouterr()

    assert pretrain(run_file, damaged, "--resume", "auto", "--set", "train.steps=6") == 0
    said = capsys.readouterr().out
    assert f"skipping checkpoint {latest}: {shard} has" in said and "truncated" in said
    assert f"resumed from {checkpoint.step_dir(damaged, 4)} at step 4" in said
    steps = [json.loads(x) for x in (damaged / "metrics.jsonl").read_text().splitlines()]
    ref = [json.loads(x) for x in (reference / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in steps] == [r["loss"] for r in ref]  # steps 5 and 6 again, bit for bit
    assert _export(damaged, tmp_path / "a") == 0 and _export(reference, tmp_path / "b") == 0
    a, b = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_export_skips_a_changed_latest_and_refuses_when_none_is_intact(tiny, tmp_path, capsys):
    run_file, _ = tiny
    out = tmp_path / "out"
    assert pretrain(run_file, out) == 0
    for step in (2, 4, 6):  # a changed byte, same size: only the hash can tell
        shard = next(checkpoint.step_dir(out, step).glob("*.distcp"))
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
    capsys.readouterr()
    assert _export(out, tmp_path / "e") == 2
    err = capsys.readouterr().err
    assert err.count("skipping checkpoint") == 3 and "does not hash to what was written" in err
    assert "none of its 3 checkpoints is intact" in one_line(err)
    assert _export(checkpoint.step_dir(out, 4), tmp_path / "e") == 2
    assert f"{checkpoint.step_dir(out, 4)} is damaged" in one_line(capsys.readouterr().err)


@pytest.mark.slow  # ~10 s on 2 cores
def test_resume_refuses_another_tokenizer_or_other_data_naming_the_key(tiny, tmp_path, capsys):
    run_file, tokens = tiny
    out = tmp_path / "out"
    (tokens / "tokenizer.json").write_text('{"model": "one"}')
    assert pretrain(run_file, out, "--set", "train.steps=2") == 0
    (tokens / "tokenizer.json").write_text('{"model": "two"}')  # same size, other tokenizer
    capsys.readouterr()
    assert pretrain(run_file, out, "--resume", "auto", "--set", "train.steps=4") == 2
    line = one_line(capsys.readouterr().err)
    assert "another tokenizer (tokenizer: checkpoint 'sha256:" in line and "init_from" in line
    (tokens / "tokenizer.json").write_text('{"model": "one"}')
    write_shards(tokens, seed=1)  # same folder, same counts, other tokens
    assert pretrain(run_file, out, "--resume", "auto", "--set", "train.steps=4") == 2
    assert "another data (data: checkpoint" in one_line(capsys.readouterr().err)
    write_shards(tokens, seed=0)
    assert pretrain(run_file, out, "--resume", "auto", "--set", "train.steps=4") == 0


def _finite_checkpoints(out: Path, scratch: Path) -> list[int]:
    """Steps of the run's checkpoints, after checking that each one's weights are all finite."""
    steps = []
    for path in checkpoint.complete_checkpoints(out):
        assert _export(path, scratch / path.name) == 0
        weights = load_file(scratch / path.name / "model.safetensors")
        assert all(bool(torch.isfinite(t).all()) for t in weights.values()), path
        steps.append(int(path.name.split("-")[1]))
    return steps


def test_a_diverging_run_stops_naming_the_step_and_saves_nothing_non_finite(tiny, tmp_path, capsys):
    run_file, _ = tiny
    with pytest.raises(SystemExit) as stop:
        pretrain(run_file, tmp_path / "inf", "--set", "optim.lr=inf")
    assert stop.value.code == 2
    assert "[optim]: lr: expected a finite number, got inf" in one_line(capsys.readouterr().err)
    out = tmp_path / "out"
    assert pretrain(run_file, out, "--set", "optim.lr=1e30", "--set", "checkpoint.save_every=1",
                    "--set", "optim.warmup_steps=0") == 2
    line = one_line(capsys.readouterr().err)
    assert "step 2: the loss is" in line and "last checkpoint is finite" in line
    assert _finite_checkpoints(out, tmp_path / "scratch") == [1]
    skipping = tmp_path / "skip"
    assert pretrain(run_file, skipping, "--set", "optim.lr=1e30", "--set", "optim.warmup_steps=0",
                    "--set", "train.nonfinite=skip", "--set", "train.max_nonfinite_skips=2") == 2
    assert "after 2 skipped batches" in one_line(capsys.readouterr().err)
    records = [json.loads(x) for x in (skipping / "metrics.jsonl").read_text().splitlines()]
    assert [r["nonfinite_skips"] for r in records] == [0, 1, 2]


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1100k", "tmpfs", str(disk)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({made.stderr.decode().strip()}): needs root")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_names_the_file_and_keeps_the_previous_checkpoint(tiny, small_disk, capsys):
    run_file, _ = tiny
    out = small_disk / "out"
    assert pretrain(run_file, out, "--set", "checkpoint.save_every=1", "--set", "train.steps=50") == 2
    line = one_line(capsys.readouterr().err)
    assert "no space left on device while writing" in line and str(out / "checkpoints") in line
    kept = checkpoint.complete_checkpoints(out)
    assert kept and checkpoint.damage(kept[-1]) is None
    assert not list((out / "checkpoints").glob(".tmp-*"))  # the failed save gave its space back
