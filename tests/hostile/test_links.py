"""No write through a symbolic link (issue "Hostile inputs, third round", item 2).

    python -m pytest tests/hostile/test_links.py -q

`results.json`, `config.json` or a plot of an `evalm eval icl` folder, or `config.json` of an `evalm
export` folder, replaced by a link to a file elsewhere: the rerun wrote through the link and the file
it points to was overwritten. Every write in an output folder now refuses a link (a check before the
atomic rename, O_NOFOLLOW for appends), in one line naming it, and the file it points to is kept.
The package's source is read for writes that bypass those helpers.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from evalm.storage import LinkedOutput, staged, write_atomic
from tests import models
from tests.hostile.conftest import REPO, one_line

VICTIM = "a file of the user's, elsewhere\n"


def _eval(*argv) -> int:
    from evalm.icl_eval.cli import main

    return main(["icl", *map(str, argv)])


def _victim(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "elsewhere" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(VICTIM)
    return path


@pytest.mark.parametrize("name", ["results.json", "config.json", "accuracy_vs_shots.png", "predictions.jsonl"])
def test_an_eval_output_linked_elsewhere_is_refused_and_its_target_kept(tmp_path, capsys, name):
    model, task = models.byte_model(tmp_path / "m"), models.two_label_task(tmp_path / "t")
    flags = ["--checkpoint", model, "--task", task, "--shots", "0,2", "--seeds", "1", "--methods", "concat",
             "--save-predictions", "--out", tmp_path / "o"]
    assert _eval(*flags) == 0
    victim = _victim(tmp_path, name)
    (tmp_path / "o" / name).unlink()
    (tmp_path / "o" / name).symlink_to(victim)
    capsys.readouterr()
    assert _eval(*flags) == 2  # was: exit 0, the victim overwritten with the evaluation's file
    line = one_line(capsys.readouterr().err)
    assert f"{tmp_path / 'o' / name} is a symbolic link (to {victim}); evalm never writes through a link" in line
    assert victim.read_text() == VICTIM


def test_an_export_config_linked_elsewhere_is_refused_and_its_target_kept(tmp_path, capsys, tiny):
    from evalm.train.export import main as export
    from tests.hostile.conftest import pretrain

    run_file, _ = tiny
    assert pretrain(run_file, tmp_path / "run", "--set", "train.steps=2") == 0
    out = tmp_path / "model"
    argv = ["--checkpoint", str(tmp_path / "run"), "--out", str(out)]
    assert export(argv) == 0
    victim = _victim(tmp_path, "config.json")
    (out / "config.json").unlink()
    (out / "config.json").symlink_to(victim)
    capsys.readouterr()
    assert export(argv) == 2
    assert f"{out / 'config.json'} is a symbolic link" in one_line(capsys.readouterr().err)
    assert victim.read_text() == VICTIM
    (out / "config.json").unlink()
    assert export(argv) == 0  # the link removed: the export is written again


def test_the_writers_refuse_links_dangling_or_not_and_fifos(tmp_path):
    victim = _victim(tmp_path, "v.txt")
    for target in (victim, tmp_path / "gone.txt"):  # a link to a file, a dangling link (it would create the file)
        link = tmp_path / "out.json"
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        with pytest.raises(LinkedOutput, match="is a symbolic link"):
            write_atomic(link, "{}")
        from evalm.storage.files import appended

        with pytest.raises(LinkedOutput, match="is a symbolic link"):
            appended(link)
    assert victim.read_text() == VICTIM and not (tmp_path / "gone.txt").exists()
    os.mkfifo(tmp_path / "pipe.json")
    with pytest.raises(LinkedOutput, match="a FIFO"):
        write_atomic(tmp_path / "pipe.json", "{}")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").symlink_to(victim)
    with pytest.raises(LinkedOutput, match="is a symbolic link"):
        with staged(folder) as stage:
            (stage / "weights.bin").write_text("w")
            (stage / "config.json").write_text("{}")
    assert victim.read_text() == VICTIM and not (folder / "weights.bin").exists()  # nothing moved in
    assert [p.name for p in folder.iterdir()] == ["config.json"]


WRITES = {"write_text", "write_bytes", "savefig", "save_file", "save_pretrained", "np.save", "np.savez", "to_parquet"}
ALLOWED = {
    # writes into a fresh staging folder (storage.staged) or a temporary file of storage.replaced
    "train/convert.py", "train/hf_export.py", "train/uptrain_model.py", "icl_eval/models/t5.py",
    "text/hf_tokenizer.py", "storage/files.py", "icl_eval/report.py",
    "data_pipeline/dedup_verify.py", "data_pipeline/dedup_job.py", "data_pipeline/blend_job.py",
    "icl_eval/protocol/units.py", "train/shards.py", "train/prepare.py", "train/widen.py",
    # not a file of an output folder a user names: a bug log, the sample builder's own staging folder, a
    # checkpoint's temporary folder (renamed complete), the log of a Redis server started in a folder of its own
    "config_toolkit/errors.py", "data_pipeline/samples/build.py", "data_pipeline/samples/pile.py",
    "data_pipeline/samples/records.py", "train/checkpoint.py", "data_pipeline/dedup_cluster.py",
    # the device run's evidence folder, which it makes itself (mkdir exist_ok=False) before writing into it
    "launcher/device_run.py",
}


def test_no_direct_write_outside_the_files_that_write_through_the_link_safe_helpers():
    """A new `path.write_text(...)` in a command's output folder would write through a link again: every file
    of the package that writes directly is listed above with why it may."""
    found = set()
    for folder in ("evalm", "config_toolkit", "data_pipeline", "train", "icl_eval", "launcher", "storage", "text"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    name = node.func.attr
                    owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
                    if name in WRITES or f"{owner}.{name}" in WRITES or (name == "open" and _writing(node)):
                        found.add(str(path.relative_to(REPO)))
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and (
                        node.func.id in WRITES or node.func.id == "open" and _writing(node)):
                    found.add(str(path.relative_to(REPO)))
    assert found <= ALLOWED, sorted(found - ALLOWED)


def _writing(node: ast.Call) -> bool:
    modes = [a.value for a in node.args[1:2] if isinstance(a, ast.Constant)]
    modes += [k.value.value for k in node.keywords if k.arg == "mode" and isinstance(k.value, ast.Constant)]
    return any(isinstance(m, str) and set(m) & set("wax") for m in modes)
