"""`evalm run`'s console: a stage's log lines, including those of datatrove's worker processes
(which write to file descriptor 2 themselves), go to the stage's log file, not to the terminal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalm.launcher.console import StageFailed, call


def _corpus(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for part in range(2):  # two files, two tasks, two worker processes
        rows = [{"text": f"document {part}-{i}: " + "the quick brown fox jumps over the lazy dog. " * 30,
                 "meta": {"pile_set_name": "Pile-CC"}} for i in range(5)]
        (folder / f"train-{part:02d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_worker_process_log_lines_go_to_the_stage_log_not_the_console(tmp_path, capfd):
    corpus = _corpus(tmp_path / "pile")
    log = tmp_path / "logs" / "filter.log"
    call(["data", "filter", "--input", str(corpus), "--output", str(tmp_path / "out"), "--tasks", "2",
          "--workers", "2"], log)
    console = capfd.readouterr()
    text = log.read_text()
    # datatrove shows INFO only from the worker holding local rank 0: its lines and the pool's
    assert "Processing done for rank=" in text and "2/2 tasks completed" in text, text[:3000]
    assert "datatrove" not in console.err + console.out, (console.err + console.out)[:2000]


def test_a_closed_progress_bar_ends_its_console_line():
    import io

    from evalm.launcher.console import _ProgressOnly

    console, log = io.StringIO(), io.StringIO()
    err = _ProgressOnly(console, log)
    err.write("\rbar:  50%")
    err.write("\rbar: 100%")
    err.write("\n")  # tqdm's close
    err.write("a log line\n")
    assert console.getvalue() == "\rbar:  50%\rbar: 100%\n" and log.getvalue() == "a log line\n"


def test_a_stage_that_hit_a_bug_says_so_and_its_log_names_the_traceback(tmp_path, monkeypatch):
    """`evalm run` reports a stage's user error as the stage's one line; a bug (exit 1) is not
    dressed as something to fix: the stage says it stopped on an internal error, and its log holds
    the line naming the file with the traceback."""
    def broken(*args, **kwargs):
        raise IndexError("list index out of range")

    monkeypatch.delenv("EVALM_DEBUG", raising=False)
    monkeypatch.setattr("evalm.data_pipeline.cli.record_settings", broken)
    corpus = _corpus(tmp_path / "pile")
    log = tmp_path / "logs" / "filter.log"
    with pytest.raises(StageFailed, match="stopped on an internal error \\(a bug, not your input\\)"):
        call(["data", "filter", "--input", str(corpus), "--output", str(tmp_path / "out")], log)
    trace = tmp_path / "out" / "logs" / "error.log"
    assert "evalm data filter: bug: IndexError: list index out of range" in log.read_text()
    assert f"traceback in {trace};" in log.read_text() and "in broken" in trace.read_text()
