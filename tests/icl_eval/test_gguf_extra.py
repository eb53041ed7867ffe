"""`--gguf-file` without the `gguf` package: one line naming the extra, before any work (not a bug report).

    python -m pytest tests/icl_eval/test_gguf_extra.py -q
"""

from __future__ import annotations

import sys

import pytest


@pytest.mark.parametrize("command", [["eval", "recall", "--tasks", "passkey", "--lengths", "1024"],
                                     ["eval", "icl", "--task", "synthetic", "--shots", "0"]])
def test_a_gguf_file_without_the_gguf_package_is_one_line(tmp_path, monkeypatch, capsys, command):
    pytest.importorskip("transformers")
    from evalm.launcher.cli import main

    monkeypatch.setitem(sys.modules, "gguf", None)  # what importlib reports for a package that is not installed
    (tmp_path / "model").mkdir()  # the output apart from the model folder: never written into (storage.RunFolder)
    code = main([*command, "--hf-model", str(tmp_path / "model"), "--gguf-file", "model.gguf", "--out",
                 str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "gguf package" in err and "evalm[smollm]" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_convert_refuses_a_gguf_file_without_the_gguf_package_in_one_line(tmp_path, monkeypatch, capsys):
    pytest.importorskip("transformers")
    from evalm.launcher.cli import main

    monkeypatch.setitem(sys.modules, "gguf", None)
    code = main(["convert", "--hf-model", str(tmp_path), "--gguf-file", "model.gguf", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "gguf package" in err and len(err.strip().splitlines()) == 1, err
