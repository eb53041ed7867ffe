"""One owner per output folder: a second writer is refused at once, naming the holder; a lock
left by a dead process never blocks. Shown for every command that writes a folder."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

from tests.hostile.conftest import REPO, one_line, pretrain, wait_for
from tests.train.helpers import tiny_run_file


def test_two_trainings_on_one_folder_exactly_one_proceeds_and_a_dead_holder_never_blocks(tiny, tmp_path, capsys):
    run_file, tokens = tiny
    long_run = tiny_run_file(tmp_path / "long.toml", tokens, steps=100_000, save_every=50)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen([sys.executable, "-m", "evalm.launcher.cli", "train", "pretrain", "--config",
                              str(long_run), "--out", str(out)], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (out / "metrics.jsonl").is_file())  # the first run is training
        assert pretrain(run_file, out) == 2
        line = one_line(capsys.readouterr().err)
        assert f"is in use by pid {first.pid} on {socket.gethostname()} (evalm train pretrain" in line
        assert first.poll() is None  # the first run goes on, untouched
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=60)
    record = json.loads((out / ".evalm.lock").read_text())
    assert record["pid"] == first.pid  # the dead run's lock file is still there ...
    assert pretrain(run_file, out, "--resume", "auto") == 0  # ... and blocks nothing


def test_export_eval_and_data_stages_refuse_a_held_folder(tiny, tmp_path, holder, capsys, byte_model,
                                                         two_label_task):
    from evalm.data_pipeline.cli import main as data
    from evalm.icl_eval.cli import main as evaluate
    from evalm.train.export import main as export

    run_file, _ = tiny
    assert pretrain(run_file, tmp_path / "run", "--set", "train.steps=2") == 0
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"text": "a b c", "meta": {"pile_set_name": "Pile-CC"}}\n')
    book = tmp_path / "book.txt"
    book.write_text("word " * 3000)
    commands = {
        "export": lambda out: export(["--checkpoint", str(tmp_path / "run"), "--out", str(out)]),
        "eval icl": lambda out: evaluate(["icl", "--checkpoint", str(byte_model), "--task", str(two_label_task),
                                          "--methods", "concat", "--shots", "0,1", "--seeds", "1", "--out", str(out)]),
        "eval ppl": lambda out: evaluate(["ppl", "--checkpoint", str(byte_model), "--books", str(book), "--lengths",
                                          "64", "--ppl.baselines=[]", "--out", str(out)]),
        "data filter": lambda out: data(["filter", "--input", str(tmp_path / "in"), "--output", str(out)]),
    }
    for name, command in commands.items():
        out = tmp_path / name.replace(" ", "-")
        held = holder(out)
        capsys.readouterr()
        assert command(out) == 2, name
        line = one_line(capsys.readouterr().err)
        assert f"is in use by pid {held.proc.pid}" in line, (name, line)
        assert sorted(p.name for p in out.iterdir()) == [".evalm.lock"], name  # nothing written
        held.stop()
        assert command(out) == 0, name  # the holder died: the folder is free


def test_the_main_job_holds_its_run_folder(tmp_path, holder, capsys):
    from evalm.launcher.run import main

    run_file = tmp_path / "run.toml"
    run_file.write_text(f'[run]\nname = "mine"\nroot = "{tmp_path}"\n')
    held = holder(tmp_path / "mine")
    assert main([str(run_file)]) == 2
    assert f"is in use by pid {held.proc.pid}" in one_line(capsys.readouterr().err)
