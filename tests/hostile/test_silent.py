"""Inputs that were silently accepted: each once ran to exit 0 with a wrong or
meaningless result; now each is refused in one line (exit 2) naming what to fix, or, for a book named
twice, scored once and said so.

    python -m pytest tests/hostile/test_silent.py -q
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from evalm.config_toolkit import ConfigError
from evalm.io import load_model
from tests.hostile.conftest import one_line
from tests.hostile.hf_folders import header, write_header
from tests.models import two_label_task

GRID = ["--shots", "0,2", "--seeds", "1", "--methods", "concat"]


def _eval(*argv) -> int:
    from evalm.icl_eval.cli import main

    return main([str(a) for a in argv])


@pytest.mark.parametrize("labels, said", [
    ('["no", "no"]', "labels ['no', 'no'] give ['no'] more than once"),
    ('"no"', '`labels` must be a list, e.g. labels = ["no", "yes"]; got \'no\''),
    ('["no", ""]', "labels must be non-empty strings, got '' in ['no', '']"),
    ('["no", "  "]', "labels must be non-empty strings, got '  '"),
])
def test_labels_are_a_list_of_distinct_non_empty_strings(tmp_path, capsys, byte_model, labels, said):
    """Two equal labels are one candidate counted twice; a string was read as its letters (labels
    "no" were the candidates n and o); an empty label scores no token, so its score is NaN, and NaN
    won the argmax."""
    task = two_label_task(tmp_path / "task")
    task.write_text(task.read_text().replace('["no", "yes"]', labels))
    assert _eval("icl", "--checkpoint", byte_model, "--task", task, *GRID, "--out", tmp_path / "out") == 2
    line = one_line(capsys.readouterr().err)
    assert str(task) in line and said in line
    assert not (tmp_path / "out").exists()


def _unknown_section(argv: list, capsys) -> str:
    from evalm.launcher.cli import main

    try:
        code = main([str(a) for a in argv])
    except SystemExit as stop:  # training's parser exits itself
        code = stop.code
    assert code == 2
    return one_line(capsys.readouterr().err)


def test_a_misspelled_section_is_refused_by_every_command_as_by_training(tmp_path, capsys, byte_model, tiny):
    """One rule (config_toolkit.check_sections): training refused `--trian.steps=1`, evaluation ignored
    `--evl.seeds=[7]` and `--eval.methd.scoring=...` and ran with the defaults (exit 0)."""
    run_file, _ = tiny
    task = two_label_task(tmp_path / "task")
    book = tmp_path / "book.txt"
    book.write_text("word " * 300)
    config = tmp_path / "eval.toml"
    config.write_text("[evl]\nseeds = [7]\n")
    icl = ["eval", "icl", "--checkpoint", byte_model, "--task", task, *GRID, "--out", tmp_path / "o"]
    ppl = ["eval", "ppl", "--checkpoint", byte_model, "--books", book, "--lengths", "64", "--out", tmp_path / "p"]
    for argv, name, valid in [
        (["train", "pretrain", "--config", run_file, "--out", tmp_path / "t", "--trian.steps=1"], "trian",
         "['model', 'data', 'optim', 'train', 'checkpoint']"),
        ([*icl, "--evl.seeds=[7]"], "evl", "['eval', 'eval.method', 'model', 'synthetic']"),
        ([*icl, "--config", config], "evl", "['eval', 'eval.method', 'ppl', 'recall', 'model', 'synthetic']"),  # a shared file's
        ([*ppl, "--set", "pll.max_books=1"], "pll", "['ppl', 'model', 'synthetic']"),
        ([*icl, "--ppl.max_books=1"], "ppl", "['eval', 'eval.method', 'model', 'synthetic']"),  # a flag: its command's
    ]:
        line = _unknown_section(argv, capsys)
        assert f"unknown section(s) ['{name}']; valid sections: {valid}" in line, (argv, line)
    assert "--evl.seeds: unknown section" in _unknown_section([*icl, "--evl.seeds=[7]"], capsys)
    line = _unknown_section([*icl, "--eval.methd.scoring=answer-mean"], capsys)
    assert "[eval]: unknown key(s) ['methd']" in line
    data_config = tmp_path / "data.toml"
    data_config.write_text("[filtr]\nchar_ngram = 5\n")
    line = _unknown_section(["data", "filter", "--input", book, "--output", tmp_path / "d", "--config", data_config],
                            capsys)
    assert "unknown section(s) ['filtr']; valid sections: ['filter', 'dedup', 'blend']" in line
    from evalm.train.metaicl import load_configs

    with pytest.raises(ConfigError, match=r"unknown section\(s\) \['metaicl_typo'\]"):
        load_configs(None, ["metaicl_typo.steps=1"])
    assert not any((tmp_path / name).exists() for name in "otpd")


@pytest.mark.parametrize("section, said", [
    ('[filter.overrides."DM Mathematics"]\nmax_special_ratio = nan\n', "overrides: expected a finite number, got nan"),
    ('[filter.overrides."DM Mathematics"]\nmin_words = true\n', "overrides: expected a number, got true"),
    ("[filter]\nchar_ngram = 0\n", "char_ngram must be >= 1, got 0"),
    ("[filter]\nword_ngram = 0\n", "word_ngram must be >= 1, got 0"),
])
def test_values_inside_tables_and_zero_ngrams_are_refused(tmp_path, capsys, section, said):
    """NaN inside a dict-valued setting passed the finite-number check of top-level values (a NaN
    threshold makes every comparison false); char_ngram = 0 counts empty n-grams, so every document was
    rejected as repetitive."""
    from evalm.launcher.cli import main

    (tmp_path / "in.jsonl").write_text(json.dumps({"text": "a b c " * 50, "meta": {"pile_set_name": "Pile-CC"}}) + "\n")
    (tmp_path / "data.toml").write_text(section)
    assert main(["data", "filter", "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out"),
                 "--config", str(tmp_path / "data.toml")]) == 2
    line = one_line(capsys.readouterr().err)
    assert str(tmp_path / "data.toml") in line and said in line
    assert not (tmp_path / "out").exists()


def test_a_book_named_three_ways_is_scored_once_and_said(tmp_path, capsys, byte_model, monkeypatch):
    books = tmp_path / "books"
    books.mkdir()
    (books / "a.txt").write_text("the long book " * 200)
    (books / "link.txt").symlink_to(books / "a.txt")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert _eval("ppl", "--checkpoint", byte_model, "--books", "books", "books/a.txt", "books/../books/a.txt",
                 "--lengths", "64", "--out", out) == 0
    err = capsys.readouterr().err
    assert "--books: books/link.txt is books/a.txt again (the same file); scored once" in err
    assert "--books: books/../books/a.txt is books/a.txt again (the same file); scored once" in err
    results = json.loads((out / "results.json").read_text())
    assert results["execution"]["units"] == 1


def test_nul_bytes_in_a_jsonl_book_are_refused_as_in_a_txt_book(tmp_path, capsys, byte_model):
    book = tmp_path / "books.jsonl"
    book.write_text(json.dumps({"text": "fine words " * 100}) + "\n" + json.dumps({"text": "a\x00b " * 200}) + "\n")
    assert _eval("ppl", "--checkpoint", byte_model, "--books", book, "--lengths", "64", "--out", tmp_path / "o") == 2
    line = one_line(capsys.readouterr().err)
    assert f"{book}: row 1: not a book (NUL bytes at offset 1" in line




def test_a_tensor_dtype_changed_in_the_header_is_refused(tmp_path, byte_model):
    """F32 -> I32 keeps every byte count: the weights loaded as integers' bit patterns (values ~1e9)."""
    folder = Path(shutil.copytree(byte_model, tmp_path / "model"))
    weights = folder / "model.safetensors"
    value, rest = header(weights)
    value["blocks.0.mlp.fc1.weight"]["dtype"] = "I32"
    write_header(weights, value, rest)
    with pytest.raises(ValueError, match=r"tensor blocks.0.mlp.fc1.weight is stored as I32, the others as F32"):
        load_model(folder)


def test_weights_without_their_config_record_are_refused(tmp_path, byte_model):
    """Saved without the `evalm.model` metadata, the architecture comparison was skipped: a changed
    window_size (no tensor's shape) evaluated another model without a word."""
    from safetensors.torch import load_file, save_file

    folder = Path(shutil.copytree(byte_model, tmp_path / "model"))
    save_file(load_file(folder / "model.safetensors"), folder / "model.safetensors")  # no metadata
    config = json.loads((folder / "config.json").read_text())
    config["model"]["window_size"] = 4
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="does not record the model it holds .* export the model again"):
        load_model(folder)

