"""User errors end in one line naming the file, line or flag and what to do; `--debug` shows the traceback.

Each case is a real `evalm` process (`python -m evalm.launcher.cli`), as a user meets it.

Run: python -m pytest tests/launcher/test_cli_errors.py -q
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.models import byte_model
from tests.train.helpers import tiny_run_file, write_shards

REPO = Path(__file__).resolve().parents[2]


def evalm(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("EVALM_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "evalm.launcher.cli", *argv], capture_output=True, text=True,
                          env=env, cwd=cwd or REPO, timeout=300)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The error: exit status 2, no traceback, at most two lines on stderr (progress bars aside)."""
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "\r" not in ln]
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert 1 <= len(lines) <= 2, proc.stderr
    return lines[-1]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    return byte_model(tmp_path_factory.mktemp("ckpt") / "model")


def _task(folder: Path, task_lines: str, rows: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = folder / "task.toml"
    path.write_text(f"# my task\n\n[task]\n{task_lines}train = \"train.jsonl\"\ntest = \"test.jsonl\"\n")
    return path


@pytest.mark.slow  # ~12 s on 2 cores; tests/hostile's task-file refusals stay in CI
def test_task_file_missing_a_field_names_file_and_line(tmp_path, ckpt):
    rows = [{"text": "good", "label": 1}, {"text": "bad", "label": 0}]
    task = _task(tmp_path / "a", 'labels = ["negative", "positive"]\n', rows)
    err = one_line_error(evalm("eval", "icl", "--checkpoint", str(ckpt), "--task", str(task), "--shots", "0"))
    assert f"{task}:3:" in err and "template" in err  # [task] is on line 3
    # a data row without a field the template needs: the file and its line
    rows = [{"text": "good", "label": 1}, {"label": 0}, {"text": "fine", "label": 1}]
    task = _task(tmp_path / "b", 'template = "{text} {label}"\nlabels = ["no", "yes"]\n', rows)
    err = one_line_error(evalm("eval", "icl", "--checkpoint", str(ckpt), "--task", str(task), "--shots", "0"))
    assert "train.jsonl: line 2" in err and "'text'" in err


def test_missing_and_unexported_checkpoints_say_what_to_do(tmp_path):
    (tmp_path / "b.txt").write_text("a book " * 200)
    missing = tmp_path / "nope"
    err = one_line_error(evalm("eval", "ppl", "--checkpoint", str(missing), "--books", str(tmp_path / "b.txt"),
                               "--lengths", "64"))
    assert f"--checkpoint {missing}: no such folder" in err and "evalm export" in err
    run = tmp_path / "run"
    (run / "checkpoints" / "step-00000002").mkdir(parents=True)
    err = one_line_error(evalm("eval", "ppl", "--checkpoint", str(run), "--books", str(tmp_path / "b.txt"),
                               "--lengths", "64"))
    assert f"evalm export --checkpoint {run} --out {run}-model" in err and "training run" in err
    debug = evalm("--debug", "eval", "ppl", "--checkpoint", str(missing), "--books", str(tmp_path / "b.txt"),
                  "--lengths", "64")
    assert debug.returncode != 0 and "Traceback" in debug.stderr  # --debug: the traceback


@pytest.mark.slow  # ~10 s on 2 cores
def test_empty_books_folder_and_bad_methods(tmp_path, ckpt):
    (tmp_path / "books").mkdir()
    err = one_line_error(evalm("eval", "ppl", "--checkpoint", str(ckpt), "--books", str(tmp_path / "books"),
                               "--lengths", "64"))
    assert str(tmp_path / "books") in err and ".txt files, one book each" in err
    err = one_line_error(evalm("eval", "icl", "--methods", "incremental,cocnat"))
    assert "argument --methods: unknown name(s) cocnat; valid: incremental, concat, structured, saicl" in err


# 1: most of the run is checkpoint saves, where Ctrl-C lands; 2 (~16 s on 2 cores) is slow
@pytest.mark.parametrize("save_every", [pytest.param(2, marks=pytest.mark.slow), 1])
def test_ctrl_c_in_pretraining_says_how_to_resume_and_that_works(tmp_path, save_every):
    write_shards(tmp_path / "tokens")
    run_file = tiny_run_file(tmp_path / "run.toml", tmp_path / "tokens", steps=100_000, save_every=save_every)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "evalm.launcher.cli", "train", "pretrain", "--config", str(run_file),
                             "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 240
    while not list(out.glob("checkpoints/step-*")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=90)  # a step ends in well under a second; the watchdog at 60 s
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    hint = [ln for ln in stderr.splitlines() if "resume with: " in ln]
    assert len(hint) == 1, stderr
    command = hint[0].split("resume with: ", 1)[1]
    assert command == f"evalm train pretrain --config {run_file} --out {out} --resume auto"
    # the printed command continues the run from its last complete checkpoint (here to two steps past it)
    last = max(int(p.name.split("-")[1]) for p in out.glob("checkpoints/step-*"))
    again = evalm(*command.split()[1:], "--set", f"train.steps={last + 2}")
    assert again.returncode == 0, again.stderr
    metrics = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(m["step"] for m in metrics) == last + 2, metrics[-3:]


@pytest.mark.parametrize("argv", [("run", "--bogus"), ("data", "filter", "--bogus"), ("data", "samples", "--bogus"),
                                  ("train", "metaicl", "--bogus"), ("train", "pretrain", "--bogus"),
                                  ("eval", "icl", "--bogus"), ("export", "--bogus")])
def test_a_bad_flag_is_one_line_for_every_command(argv):
    line = one_line_error(evalm(*argv))
    assert "error:" in line and "--help" in line  # names the flag (or the missing ones) and where to look
    assert ("--bogus" in line) or ("required" in line)
