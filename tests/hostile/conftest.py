"""Shared pieces of the hostile-input tests: a finished tiny run, a lock held by another process."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import models
from tests.train.helpers import tiny_run_file, write_shards

REPO = Path(__file__).resolve().parents[2]


def pretrain(run_file: Path, out: Path, *extra: str) -> int:
    """`evalm train pretrain` in this process (a world of one)."""
    from evalm.train.pretrain import main

    return main(["--config", str(run_file), "--out", str(out), *extra])


@pytest.fixture
def tiny(tmp_path) -> tuple[Path, Path]:
    """(run file, token shards) of a 6-step run that saves every 2 steps and keeps every checkpoint."""
    write_shards(tmp_path / "tokens")
    return tiny_run_file(tmp_path / "run.toml", tmp_path / "tokens", steps=6, save_every=2), tmp_path / "tokens"


class Holder:
    """Another live process holding `folder`'s lock, as a concurrent run would."""

    def __init__(self, folder: Path):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import sys, time\nfrom evalm.storage import folder_lock\n"
             "with folder_lock(sys.argv[1], 'test holder'):\n    print('held', flush=True)\n    time.sleep(600)",
             str(folder)], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "held"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def holder():
    made: list[Holder] = []

    def hold(folder: Path) -> Holder:
        made.append(Holder(folder))
        return made[-1]

    yield hold
    for h in made:
        h.stop()


@pytest.fixture(scope="session")
def byte_model(tmp_path_factory) -> Path:
    """An exported one-layer EVALM over bytes (vocab 257), so eval commands load instead of training."""
    return models.byte_model(tmp_path_factory.mktemp("byte-model") / "model")


@pytest.fixture(scope="session")
def two_label_task(tmp_path_factory) -> Path:
    """A task file with 8 train and 4 test rows of two labels."""
    return models.two_label_task(tmp_path_factory.mktemp("task"))


def refused_in_process(argv: list) -> str:
    """`evalm ARGV` in this process, which must end as a user error (exit 2, no `bug:` line): that line.
    (No prompt can be answered here: reading stdin under pytest fails.)"""
    import contextlib
    import io

    from evalm.launcher.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as stop:  # a flag argparse refused (its type: --device, sizes) exits 2 from parse_args
            code = stop.code
    assert code == 2 and "bug:" not in err.getvalue(), err.getvalue()[-2000:]
    return one_line(err.getvalue())


def one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert "Traceback" not in stderr, stderr
    return lines[-1]


def wait_for(predicate, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
