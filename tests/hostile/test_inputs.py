"""Values and files checked at the boundary: each was once accepted and gave a wrong result or a
traceback; now each is refused in one line that names the value or file, before anything is written."""

from __future__ import annotations

import json
import os

import pytest
import torch

from evalm import EvalmModel, ModelConfig
from evalm.io import load_model, save_model
from tests.hostile.conftest import one_line, pretrain


@pytest.mark.parametrize("flags, said", [
    (["--shots", ""], "--shots: empty list"),
    (["--seeds", "1,1"], "--seeds: 1 given more than once"),
    (["--shots", "4,4"], "--shots: 4 given more than once"),
    (["--eval.seeds=[]"], "seeds is empty"),
    (["--eval.shots=[1, true]"], "shots: expected a number, got true"),
    (["--eval.validation_items=true"], "validation_items: expected a number, got true"),
])
def test_bad_icl_lists_are_refused_before_any_file_is_written(tmp_path, capsys, flags, said):
    from evalm.icl_eval.cli import main

    out = tmp_path / "out"
    try:
        code = main(["icl", "--test-items", "2", *flags, "--out", str(out)])
    except SystemExit as stop:  # argparse's own one-line error
        code = stop.code
    assert code == 2
    assert said in one_line(capsys.readouterr().err)
    assert not out.exists()


@pytest.mark.parametrize("flags, said", [
    (["--fixed-contexts=-5"], "fixed_contexts must be >= 1"),
    (["--ppl.max_books=0"], "max_books must be >= 1"),
    (["--lengths", "128,64"], "increasing"),
    (["--ppl.segment_tokens=0"], "segment_tokens must be >= 1"),
])
def test_bad_ppl_values_are_refused(tmp_path, capsys, flags, said):
    from evalm.icl_eval.cli import main

    book = tmp_path / "book.txt"
    book.write_text("word " * 500)
    out = tmp_path / "out"
    assert main(["ppl", "--books", str(book), *flags, "--out", str(out)]) == 2
    assert said in one_line(capsys.readouterr().err)
    assert not out.exists()


@pytest.mark.parametrize("content", [os.urandom(4096), b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)) * 8,
                                     "caf\u00e9 ".encode("latin-1") * 400])
def test_a_book_that_is_not_text_is_refused_naming_the_file(tmp_path, capsys, content, byte_model):
    from evalm.icl_eval.cli import main

    book = tmp_path / "books" / "binary.txt"
    book.parent.mkdir()
    book.write_bytes(content)
    assert main(["ppl", "--checkpoint", str(byte_model), "--books", str(book.parent), "--lengths", "64",
                 "--out", str(tmp_path / "o")]) == 2
    line = one_line(capsys.readouterr().err)
    assert str(book) in line and "not a" in line


def test_a_text_book_with_a_stray_bad_byte_is_read(tmp_path):
    from evalm.icl_eval.perplexity.books import iter_books

    book = tmp_path / "old.txt"
    book.write_bytes(b"an old scan " * 1000 + b"\xff" + b" ends here")
    [(name, text)] = list(iter_books([book]))
    assert name == "old.txt" and text.count("\ufffd") == 1


@pytest.mark.parametrize("override, said", [
    ("train.steps=true", "steps: expected a number, got true"),
    ("model.window_size=0", "window_size must be >= 1"),
    ("model.n_head=0", "n_head must be >= 1"),
    ("optim.lr=nan", "lr: expected a finite number, got nan"),
    ("data.seq_len=false", "seq_len: expected a number, got false"),
])
def test_bad_training_values_are_refused(tiny, tmp_path, capsys, override, said):
    run_file, _ = tiny
    with pytest.raises(SystemExit) as stop:
        pretrain(run_file, tmp_path / "out", "--set", override)
    assert stop.value.code == 2
    assert said in one_line(capsys.readouterr().err)
    assert not (tmp_path / "out").exists()


@pytest.fixture
def exported(tmp_path):
    torch.manual_seed(0)
    model = EvalmModel(ModelConfig(vocab_size=64, d_model=16, n_layer=1, n_head=2, d_ff=32, window_size=8,
                                   chunk_size=4, circular_period=64, dropout=0.0, attn_dropout=0.0))
    model.init_weights()
    return save_model(model, tmp_path / "model")


def _edit_config(folder, **changes):
    data = json.loads((folder / "config.json").read_text())
    data["model"].update(changes)
    (folder / "config.json").write_text(json.dumps(data))


@pytest.mark.parametrize("changes, said", [
    ({"window_size": 4}, "window_size: weights 8, config.json 4"),
    ({"chunk_size": 2}, "chunk_size: weights 4, config.json 2"),
    ({"d_ff": 48}, "d_ff: weights 32, config.json 48"),
])
def test_a_config_json_that_does_not_describe_the_weights_is_refused(exported, changes, said):
    _edit_config(exported, **changes)
    with pytest.raises(ValueError, match="does not describe") as err:
        load_model(exported)
    assert said in str(err.value) and str(exported / "config.json") in str(err.value)


def test_shapes_are_checked_when_the_weights_record_was_edited_too(exported):
    """The saved config record rewritten to agree with an edited config.json: the tensors still refuse it."""
    from safetensors.torch import load_file, save_file

    _edit_config(exported, d_ff=48)
    record = json.dumps(json.loads((exported / "config.json").read_text())["model"], sort_keys=True)
    save_file(load_file(exported / "model.safetensors"), exported / "model.safetensors", metadata={"evalm.model": record})
    with pytest.raises(ValueError, match=r"does not match the shapes .*\(32, 16\), config \(48, 16\)"):
        load_model(exported)


def test_truncated_weights_and_malformed_json_name_their_file(exported, tmp_path, capsys):
    from evalm.icl_eval.cli import main

    weights = exported / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-64])
    assert main(["icl", "--checkpoint", str(exported), "--tokenizer", "bytes", "--out", str(tmp_path / "o")]) == 2
    assert f"{weights}: damaged or truncated" in one_line(capsys.readouterr().err)
    (exported / "config.json").write_text('{"model": {"d_model": 16,}}')
    assert main(["icl", "--checkpoint", str(exported), "--out", str(tmp_path / "o")]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"{exported / 'config.json'}: not valid JSON (line 1, column" in line
