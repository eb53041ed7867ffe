"""The run folder's one owner (`storage.RunFolder`) against a hostile-but-fair user: stale units
reused after an edit, `--overwrite` deleting what the command never made, a lock file linked to
another file, an output that is a file, a damaged unit, a bug on rank 0 of a training run.

Run: python -m pytest tests/hostile/test_run_folders.py -q

Each test is the reproduction of its item of the issue "Hostile inputs, second round" (1, 2, 4 and
the run folder's part of 7), run through the real commands on real files.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests import models
from tests.hostile.conftest import REPO, one_line, pretrain
from tests.train.helpers import free_port, tiny_run_file, write_shards


def _eval(*argv) -> int:
    from evalm.icl_eval.cli import main

    return main(["icl", *map(str, argv)])


@pytest.fixture
def icl(tmp_path):
    """The issue's setup: a byte model, a two-label task (own copies: the tests edit them), the flags `A`."""
    model, task = models.byte_model(tmp_path / "m"), models.two_label_task(tmp_path / "t")
    return model, task, ["--checkpoint", model, "--task", task, "--shots", "0,2", "--seeds", "1", "--methods",
                         "concat", "--save-predictions"]


def _results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


# ---------------------------------------------------------------- 1: resume by content


def test_an_edited_task_file_is_never_resumed_from_units_of_the_old_one(icl, tmp_path, capsys):
    model, task, flags = icl
    out = tmp_path / "o"
    assert _eval(*flags, "--out", out) == 0
    task.write_text(task.read_text().replace('"no", "yes"', '"yes", "no"'))  # sed -i 's/"no", "yes"/"yes", "no"/'
    capsys.readouterr()
    assert _eval(*flags, "--out", out) == 2  # was: "(2 resumed)", exit 0, the old labels' numbers
    line = one_line(capsys.readouterr().err)
    assert "task.labels: recorded ['no', 'yes'], now ['yes', 'no']" in line and "--overwrite" in line, line
    assert _eval(*flags, "--out", out, "--overwrite") == 0
    assert "(0 resumed)" in capsys.readouterr().err
    execution = _results(out)["execution"]
    assert execution["units_resumed"] == 0 and execution["units_computed"] == 2
    fresh = tmp_path / "fresh"  # the edited task in a new folder: the same numbers
    assert _eval(*flags, "--out", fresh) == 0
    from evalm.icl_eval.protocol.units import without_execution

    assert without_execution(_results(out)) == without_execution(_results(fresh))


def test_a_data_file_edited_in_place_is_seen(icl, tmp_path, capsys):
    model, task, flags = icl
    out = tmp_path / "o"
    assert _eval(*flags, "--out", out) == 0
    test_rows = task.parent / "test.jsonl"
    stat = test_rows.stat()
    test_rows.write_text(test_rows.read_text().replace("item 3", "item 7"))  # the same size, another row
    os.utime(test_rows, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    capsys.readouterr()
    assert _eval(*flags, "--out", out) == 2
    assert "data_files.test: recorded 'sha256:" in one_line(capsys.readouterr().err)


def test_weights_copied_over_the_model_with_touch_r_are_not_resumed(icl, tmp_path, capsys):
    from evalm.io import load_model, save_model

    model, task, flags = icl
    out = tmp_path / "o"
    assert _eval(*flags, "--out", out) == 0
    other = load_model(model)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p))
    save_model(other, tmp_path / "other")
    weights = model / "model.safetensors"
    before = weights.stat()
    shutil.copyfile(tmp_path / "other" / "model.safetensors", weights)  # `cp`: the same file, rewritten
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))  # `touch -r`
    after = weights.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    capsys.readouterr()
    assert _eval(*flags, "--out", out) == 2  # was: "(2 resumed)", the old model's scores
    assert "model.files: recorded 'sha256:" in one_line(capsys.readouterr().err)


# ---------------------------------------------------------------- 2: --overwrite deletes only its own


def _data(*argv) -> int:
    from evalm.data_pipeline.cli import main

    return main([str(a) for a in argv])


def test_overwrite_never_deletes_a_folder_the_stage_did_not_make(tmp_path, capsys, tiny):
    x = tmp_path / "x"  # mkdir $T/x; echo {} > $T/x/config.json; touch $T/x/keep
    x.mkdir()
    (x / "config.json").write_text("{}\n")
    (x / "keep").write_text("")
    documents = REPO / "train" / "samples" / "documents.jsonl"
    assert _data("filter", "--input", documents, "--output", x, "--overwrite") == 2
    line = one_line(capsys.readouterr().err)  # refused before --overwrite is reached: written only if its own
    assert "`evalm data filter` writes only into a folder it made or an empty one" in line and str(x) in line
    assert sorted(p.name for p in x.iterdir() if p.name != ".evalm.lock") == ["config.json", "keep"]
    run_file, _ = tiny  # a training run folder
    assert pretrain(run_file, tmp_path / "run", "--set", "train.steps=2") == 0
    kept = sorted(p.relative_to(tmp_path / "run") for p in (tmp_path / "run").rglob("*"))
    capsys.readouterr()
    assert _data("filter", "--input", documents, "--output", tmp_path / "run", "--overwrite") == 2
    assert "it was made by `evalm train pretrain`" in one_line(capsys.readouterr().err)
    assert all((tmp_path / "run" / p).exists() for p in kept)


def test_a_stage_never_writes_into_or_deletes_its_input(tmp_path, capsys):
    from tests.data_pipeline.test_jobs import _corpus

    data = tmp_path / "data"
    _corpus(data / "in", 1, 20)
    shard = data / "in" / "000.jsonl.zst"
    (data / "config.json").write_text("{}\n")
    for output in (data, data / "in", shard.parent / "sub"):  # an ancestor of the input, the input, inside it
        capsys.readouterr()
        assert _data("filter", "--input", data / "in", "--output", output, "--overwrite") == 2
        assert f"overlaps the input {data / 'in'}" in one_line(capsys.readouterr().err)
        assert shard.is_file() and not (shard.parent / "sub").exists()
    assert _data("filter", "--input", data / "in", "--output", tmp_path / "filtered") == 0
    capsys.readouterr()
    assert _data("dedup", "--input", tmp_path / "filtered", "--output", tmp_path / "filtered", "--overwrite") == 2
    assert "overlaps the input" in one_line(capsys.readouterr().err)
    assert (tmp_path / "filtered" / "manifest.json").is_file()


# ---------------------------------------------------------------- 4: the lock never follows a link


def test_a_lock_file_linked_to_another_file_is_refused_and_that_file_kept(tmp_path, capsys, icl):
    victim = tmp_path / "victim.txt"
    victim.write_text("a file of the user's\n")
    model, task, flags = icl
    commands = {
        "data filter": lambda out: _data("filter", "--input", REPO / "train" / "samples" / "documents.jsonl",
                                         "--output", out),
        "eval icl": lambda out: _eval(*flags, "--out", out),
    }
    for name, command in commands.items():
        out = tmp_path / name.replace(" ", "-")
        out.mkdir()
        (out / ".evalm.lock").symlink_to(victim)
        capsys.readouterr()
        assert command(out) == 2, name
        assert f"{out / '.evalm.lock'} is a symbolic link" in one_line(capsys.readouterr().err), name
        assert victim.read_text() == "a file of the user's\n", name  # was: truncated, the lock record written in
        assert sorted(p.name for p in out.iterdir()) == [".evalm.lock"], name


# ---------------------------------------------------------------- 7: the run folder's one-line refusals


def test_an_output_that_is_a_file_is_one_line_for_every_command(tmp_path, capsys, icl, tiny):
    from evalm.train.export import main as export

    target = tmp_path / "results.txt"
    target.write_text("not a folder\n")
    model, task, flags = icl
    run_file, _ = tiny
    commands = {
        "eval icl": lambda: _eval(*flags, "--out", target),
        "data filter": lambda: _data("filter", "--input", REPO / "train" / "samples" / "documents.jsonl",
                                     "--output", target),
        "train pretrain": lambda: pretrain(run_file, target),
        "export": lambda: export(["--checkpoint", str(tmp_path / "run"), "--out", str(target)]),
    }
    assert pretrain(run_file, tmp_path / "run", "--set", "train.steps=2") == 0
    for name, command in commands.items():
        capsys.readouterr()
        assert command() == 2, name  # was: FileExistsError reported as a bug (exit 1)
        assert f"{target} exists and is not a folder" in one_line(capsys.readouterr().err), name
        assert target.read_text() == "not a folder\n"


def test_a_truncated_unit_is_named_and_computed_again(icl, tmp_path, capsys):
    from evalm.icl_eval.protocol.units import without_execution

    model, task, flags = icl
    out = tmp_path / "o"
    assert _eval(*flags, "--out", out) == 0
    whole = _results(out)
    unit = sorted((out / "units").glob("*.npz"))[1]
    unit.write_bytes(unit.read_bytes()[: unit.stat().st_size // 2])  # a copy cut short
    capsys.readouterr()
    assert _eval(*flags, "--out", out) == 0  # was: BadZipFile, a bug
    err = capsys.readouterr().err
    assert f"{unit}: a damaged unit file" in err and "computing it again" in err and "(1 resumed)" in err
    assert without_execution(_results(out)) == without_execution(whole)
    assert _results(out)["execution"]["units_computed"] == 1


@pytest.mark.parametrize("flags, said", [
    (["--workers", "0"], "--workers 0: the local executor runs at least one task at a time"),
    (["--executor-option", "partition=cpu"], "--executor-option partition: not an option of the local executor; "
                                              "valid: local_rank_offset, local_tasks, randomize_start_duration"),
])
def test_data_stage_flags_out_of_range_are_one_line(tmp_path, capsys, flags, said):
    out = tmp_path / "out"
    assert _data("filter", "--input", REPO / "train" / "samples" / "documents.jsonl", "--output", out, *flags) == 2
    assert said in one_line(capsys.readouterr().err)
    assert not out.exists()


# ---------------------------------------------------------------- a bug on rank 0 stays a bug on every rank


def _rank(rank: int, world: int, port: int, argv: list[str], fault: str, logs: str) -> None:
    """One rank of a torchrun-like launch of `evalm train pretrain`; rank 0's check of the run folder
    (`find_resume_path`, done once for every rank) fails with `fault`."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), OMP_NUM_THREADS="1", EVALM_DEBUG="0")
    torch.set_num_threads(1)
    from evalm.train import checkpoint
    from evalm.train.pretrain import main

    def fails(*args, **kwargs):
        if fault == "bug":
            raise ZeroDivisionError("division by zero")
        raise checkpoint.CheckpointError("the checkpoint you named is not a checkpoint; pass --resume auto")

    checkpoint.find_resume_path = fails
    threads = len(os.listdir("/proc/self/task"))
    with open(Path(logs) / f"rank{rank}.err", "w") as err, contextlib.redirect_stderr(err):
        code = main(argv)
    # gloo's worker threads must be gone when the command returns: one left releasing the broadcast's
    # tensors at interpreter exit aborted the process (SIGABRT in place of the exit code, one run in five)
    (Path(logs) / f"rank{rank}.threads").write_text(f"{threads} {len(os.listdir('/proc/self/task'))}")
    (Path(logs) / f"rank{rank}.code").write_text(str(code))


@pytest.mark.parametrize("fault, code, line", [
    ("bug", 1, "evalm train pretrain: bug: RankZeroFailed: rank 0 failed with ZeroDivisionError: division by zero"),
    ("user", 2, "evalm train pretrain: error: the checkpoint you named is not a checkpoint; pass --resume auto"),
])
def test_rank_zeros_failure_reaches_the_other_rank_as_the_kind_it_was(tmp_path, fault, code, line):
    write_shards(tmp_path / "tokens")
    run_file = tiny_run_file(tmp_path / "run.toml", tmp_path / "tokens", steps=2)
    out = tmp_path / "out"
    mp.spawn(_rank, args=(2, free_port(), ["--config", str(run_file), "--out", str(out)], fault, str(tmp_path)),
             nprocs=2, join=True)
    codes = [int((tmp_path / f"rank{r}.code").read_text()) for r in range(2)]
    assert codes == [code, code]  # was for a bug: rank 1 "error: rank 0 stopped the run: ..." (exit 2)
    for r in range(2):
        before, after = (tmp_path / f"rank{r}.threads").read_text().split()
        assert after == before, f"rank {r}: {before} threads before the command, {after} after"
    other = one_line((tmp_path / "rank1.err").read_text())
    assert other.startswith(line), other
    if fault == "bug":  # each rank's traceback kept beside the run
        assert "ZeroDivisionError" in (out / "logs" / "error.log").read_text()
        assert "RankZeroFailed" in (out / "logs" / "error-rank1.log").read_text()

