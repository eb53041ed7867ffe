"""One rule for every command that writes a folder (issue "Hostile inputs, third round", item 3).

    python -m pytest tests/hostile/test_folder_rule.py -q

A command writes only into a folder it made (its marker names it) or an empty one, never into its own
input or the model it reads, and `--overwrite` acts only on its own kind. Before: `eval icl --out`
onto a training run or onto the model it reads (its config.json replaced: the model no longer
loaded), `export --out` onto its own run or another, `convert --out` equal to its source (the float32
originals replaced) or onto a training run or an export, `train tokenizer --output` onto a filter
stage (its manifest replaced, and `data filter` still said done), its own input or a training run.
Each is refused in one line here, and what was there is kept byte for byte.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests import models
from tests.hostile.conftest import REPO, one_line, pretrain

DOCUMENTS = REPO / "train" / "samples" / "documents.jsonl"


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` but the lock (a refused run may take it) with its SHA-256."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".evalm.lock"}


def refused(command, capsys) -> str:
    capsys.readouterr()
    try:
        code = command()
    except SystemExit as stop:
        code = stop.code
    assert code == 2
    return one_line(capsys.readouterr().err)


@pytest.fixture
def run(tiny, tmp_path) -> Path:
    """A finished 2-step training run."""
    run_file, _ = tiny
    assert pretrain(run_file, tmp_path / "run", "--set", "train.steps=2") == 0
    return tmp_path / "run"


def _icl(model: Path, task: Path, out: Path, *extra) -> int:
    from evalm.icl_eval.cli import main

    return main(["icl", "--checkpoint", str(model), "--task", str(task), "--shots", "0", "--seeds", "1", "--methods",
                 "concat", "--out", str(out), *map(str, extra)])


def test_eval_never_writes_into_a_training_run_or_the_model_it_reads(tmp_path, capsys, run):
    model, task = models.byte_model(tmp_path / "model"), models.two_label_task(tmp_path / "task")
    for out, said in ((run, f"`evalm eval icl` writes only into a folder it made or an empty one, and {run} is not "
                            "one (it was made by `evalm train pretrain`)"),
                      (model, f"{model} is, or lies inside, {model}, which `evalm eval icl` reads"),
                      (model / "eval", f"{model / 'eval'} is, or lies inside, {model}")):
        before = snapshot(out.parent if out.name == "eval" else out)
        line = refused(lambda: _icl(model, task, out), capsys)  # was: exit 0, config.json replaced
        assert said in line, line
        assert snapshot(out.parent if out.name == "eval" else out) == before
    line = refused(lambda: _icl(model, task, run, "--overwrite"), capsys)
    assert "it was made by `evalm train pretrain`" in line
    from evalm.io import load_model

    load_model(model)  # the model still loads
    assert _icl(model, task, tmp_path / "fresh") == 0


def test_export_never_writes_into_a_run(tmp_path, capsys, run, tiny):
    from evalm.train.export import main as export

    run_file, _ = tiny
    assert pretrain(run_file, tmp_path / "other", "--set", "train.steps=2") == 0
    for out, said in ((run, f"{run} is, or lies inside, {run}"),
                      (run / "checkpoints", f"{run / 'checkpoints'} is, or lies inside, {run}"),
                      (tmp_path / "other", "`evalm export` writes only into a folder it made or an empty one")):
        before = snapshot(run), snapshot(tmp_path / "other")
        line = refused(lambda: export(["--checkpoint", str(run), "--out", str(out)]), capsys)
        assert said in line, line  # was: exit 0, the run's config.json replaced by the export's
        assert (snapshot(run), snapshot(tmp_path / "other")) == before
    assert export(["--checkpoint", str(run), "--out", str(tmp_path / "model")]) == 0
    assert export(["--checkpoint", str(run), "--out", str(tmp_path / "model")]) == 0  # its own folder again
    exported = models.byte_model(tmp_path / "bytes")  # --hf of an exported folder onto that folder
    before = snapshot(exported)
    line = refused(lambda: export(["--hf", "--checkpoint", str(exported), "--out", str(exported)]), capsys)
    assert f"{exported} is, or lies inside, {exported}, which `evalm export` reads" in line
    assert snapshot(exported) == before


def test_convert_never_writes_into_its_source_a_run_or_an_export(tmp_path, capsys, run):
    pytest.importorskip("transformers")
    from evalm.train.convert import main as convert
    from tests.hostile.hf_folders import llama

    source = llama(tmp_path / "llama")
    exported = models.byte_model(tmp_path / "exported")
    for out, said in ((source, f"{source} is, or lies inside, {source}, which `evalm convert` reads"),
                      (source / "eva", f"{source / 'eva'} is, or lies inside, {source}"),
                      (run, "it was made by `evalm train pretrain`"),
                      (exported, f"{exported} is not one (it has no .evalm-folder.json")):
        before = snapshot(source), snapshot(run), snapshot(exported)
        line = refused(lambda: convert(["--hf-model", str(source), "--out", str(out), "--dtype", "bfloat16"]), capsys)
        assert said in line, line  # was: exit 0, the float32 originals replaced by bfloat16 ones
        assert (snapshot(source), snapshot(run), snapshot(exported)) == before
    out = tmp_path / "eva"
    assert convert(["--hf-model", str(source), "--out", str(out)]) == 0
    line = refused(lambda: convert(["--hf-model", str(source), "--out", str(out)]), capsys)
    assert f"{out} already holds a conversion; --overwrite replaces it" in line
    assert convert(["--hf-model", str(source), "--out", str(out), "--overwrite"]) == 0
    line = refused(lambda: convert(["--hf-model", str(source), "--out", str(run), "--overwrite"]), capsys)
    assert "it was made by `evalm train pretrain`" in line


def test_train_tokenizer_never_writes_into_a_stage_its_input_or_a_run(tmp_path, capsys, run):
    from evalm.data_pipeline.cli import main as data
    from evalm.launcher.cli import main as evalm

    def tokenizer(argv: list[str]) -> int:
        return evalm(["train", "tokenizer", *argv])

    assert data(["filter", "--input", str(DOCUMENTS), "--output", str(tmp_path / "filtered")]) == 0
    inputs = tmp_path / "docs"
    inputs.mkdir()
    (inputs / "a.jsonl").write_text(DOCUMENTS.read_text())
    for out, source, said in (
            (tmp_path / "filtered", DOCUMENTS, "it was made by `evalm data filter`"),
            (inputs, inputs, f"{inputs} is, or lies inside, {inputs}, which `evalm train tokenizer` reads"),
            (run, DOCUMENTS, "it was made by `evalm train pretrain`")):
        before = snapshot(out)
        line = refused(lambda: tokenizer(["--input", str(source), "--output", str(out), "--vocab-size", "300"]),
                       capsys)
        assert said in line, line  # was: the stage's manifest replaced; no lock, no marker
        assert snapshot(out) == before
    assert data(["filter", "--input", str(DOCUMENTS), "--output", str(tmp_path / "filtered")]) == 0
    assert "filter: done" in capsys.readouterr().out
    assert tokenizer(["--input", str(DOCUMENTS), "--output", str(tmp_path / "tok"), "--vocab-size", "300"]) == 0
    assert tokenizer(["--input", str(DOCUMENTS), "--output", str(tmp_path / "tok"), "--vocab-size", "300"]) == 0
    from evalm.storage import made_by

    assert made_by(tmp_path / "tok") == "evalm train tokenizer"
