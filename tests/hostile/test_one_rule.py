"""The one error rule's gaps: user mistakes that ended in a `bug:` line (exit 1) or in
DCP's raw traceback; now each is one line naming the file (exit 2), run as the user runs `evalm`, and a
damaged checkpoint without a digest is skipped for the previous one as a digest mismatch is.

    python -m pytest tests/hostile/test_one_rule.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalm.storage import write_digest
from evalm.train import checkpoint
from tests.hostile.conftest import pretrain
from tests.hostile.limits import evalm, user_error
from tests.models import hf_tokenizer, two_label_task

GRID = ["--shots", "0,2", "--seeds", "1", "--methods", "concat"]


def _task(tmp_path: Path, edit) -> Path:
    path = two_label_task(tmp_path / "task")
    path.write_bytes(edit(path.read_text()))
    return path


def _icl(model: Path, task: Path, tmp_path: Path, *extra) -> list:
    return ["eval", "icl", "--checkpoint", model, "--task", task, *GRID, *extra, "--out", tmp_path / "out"]


def _ppl(model: Path, books, tmp_path: Path, *extra) -> list:
    return ["eval", "ppl", "--checkpoint", model, "--books", books, "--lengths", "64", *extra, "--out", tmp_path / "out"]


def label_repr(tmp_path, model):
    task = _task(tmp_path, lambda t: t.replace("{text} {label}", "{text} {label!r}").encode())
    return _icl(model, task, tmp_path), f"{task}:1: template '{{text}} {{label!r}}': slot {{label!r}} is not a field name"


def empty_slot(tmp_path, model):
    task = _task(tmp_path, lambda t: t.replace("{text} {label}", "{} {text} {label}").encode())
    return _icl(model, task, tmp_path), "slot {} is not a field name"


def latin1_task(tmp_path, model):
    task = _task(tmp_path, lambda t: ("# r\xe9sum\xe9 task\n" + t).encode("latin-1"))
    return _icl(model, task, tmp_path), f"{task}:1: not UTF-8 (byte 0xe9)"


def duplicate_key_task(tmp_path, model):
    task = _task(tmp_path, lambda t: (t + 'labels = ["a", "b"]\n').encode())
    return _icl(model, task, tmp_path), f"{task}: not valid TOML: Cannot overwrite a value (at line 6"


def duplicate_key_yaml(tmp_path, model):
    task = two_label_task(tmp_path / "task").with_suffix(".yaml")
    task.write_text("task:\n  template: '{text} {label}'\n  labels: [no, yes]\n  labels: [yes, no]\n"
                    "  train: train.jsonl\n  test: test.jsonl\n")
    return _icl(model, task, tmp_path), f"{task}:4: not valid YAML: key 'labels' given twice"


def deep_config(tmp_path, model):
    config = tmp_path / "deep.toml"
    config.write_text("[eval]\nseeds = " + "[" * 3000 + "]" * 3000 + "\n")
    return _icl(model, two_label_task(tmp_path / "task"), tmp_path, "--config", config), \
        f"{config}: nested deeper than the TOML reader can follow"


def deep_override(tmp_path, model):
    return _icl(model, two_label_task(tmp_path / "task"), tmp_path, "--eval.seeds=" + "[" * 3000 + "]" * 3000), \
        "nested deeper than the TOML reader can follow"


def symlink_loop(tmp_path, model):
    books = tmp_path / "books"
    books.mkdir()
    (books / "a.txt").symlink_to(books / "b.txt")
    (books / "b.txt").symlink_to(books / "a.txt")
    return _ppl(model, books, tmp_path), f"{books / 'a.txt'}: a loop of symbolic links"


def integer_text(tmp_path, model):
    book = tmp_path / "books.jsonl"
    book.write_text('{"text": 5}\n')
    return _ppl(model, book, tmp_path), f"{book}: row 0: `text` is int 5, not a string"


def large_tokenizer(tmp_path, model):
    from evalm.text.tokenizer import load_tokenizer

    hf_tokenizer(tmp_path / "tok")
    tok = tmp_path / "tok" / "tokenizer.json"
    ids = load_tokenizer(tok).vocab_size
    assert ids > 257
    return _icl(model, two_label_task(tmp_path / "task"), tmp_path, "--tokenizer", tok), \
        f"tokenizer {tok}: {ids} ids, but the model {model} has 257"


@pytest.mark.parametrize("case", [empty_slot, latin1_task, duplicate_key_task, duplicate_key_yaml, deep_config,
                                  deep_override, symlink_loop,
                                  *(pytest.param(c, marks=pytest.mark.slow)  # ~6-7 s each on 2 cores
                                    for c in (label_repr, integer_text, large_tokenizer))],
                         ids=lambda case: case.__name__)
def test_a_user_mistake_is_one_line_never_a_bug(tmp_path, byte_model, case):
    argv, said = case(tmp_path, byte_model)
    line = user_error(evalm(*argv, timeout=240))
    assert said in line, line


@pytest.fixture
def trained(tiny, tmp_path) -> tuple[Path, Path]:
    """(run file, run folder) of a finished 6-step run with checkpoints at steps 2, 4 and 6."""
    run_file, _ = tiny
    out = tmp_path / "out"
    assert pretrain(run_file, out) == 0
    return run_file, out


def _zero(shard: Path) -> None:
    shard.write_bytes(bytes(shard.stat().st_size))


def test_a_checkpoint_dcp_cannot_read_is_one_line_naming_it(trained, tmp_path):
    """Zeroed shards under a digest rewritten to match (whoever can damage the file can): DCP's
    CheckpointException, a BaseException, escaped `except Exception` as a raw traceback with no log."""
    _, out = trained
    step = checkpoint.step_dir(out, 6)
    _zero(next(step.glob("*.distcp")))
    write_digest(step)
    line = user_error(evalm("export", "--checkpoint", step, "--out", tmp_path / "exported", timeout=240))
    assert line.startswith(f"evalm export: error: {step}: cannot be read (") and "it is damaged" in line


@pytest.mark.parametrize("damage", ["cut", "zeroed"])
def test_a_damaged_checkpoint_without_a_digest_is_skipped_on_resume(trained, tmp_path, capsys, damage):
    """Saved before digests (or its digest.json lost), a damaged latest checkpoint was used anyway:
    DCP's raw traceback. Now its items are checked against the metadata (inside the file, loadable)
    and it is skipped for the previous one, which resumes bit for bit as the uninterrupted run."""
    run_file, out = trained
    latest = checkpoint.step_dir(out, 6)
    for step in (2, 4, 6):
        (checkpoint.step_dir(out, step) / "digest.json").unlink()
    shard = next(latest.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-100]) if damage == "cut" else _zero(shard)
    reference = [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    capsys.readouterr()
    assert pretrain(run_file, out, "--resume", "auto") == 0
    said = capsys.readouterr().out
    assert f"skipping checkpoint {latest}: {shard}" in said
    assert f"resumed from {checkpoint.step_dir(out, 4)} at step 4" in said
    assert [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()] == reference
