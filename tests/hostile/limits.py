"""Running `evalm` as a user does, in its own process, under a memory cap and a time limit.

An input without bounds makes the code before its fix hang or take all memory; under a cap and a
timeout that shows as a failed test (an exit 1 `bug:` MemoryError, a SIGSEGV, a timeout) instead of
a machine brought down. The process is its own session, so whatever it leaves behind is found by
its process group and ended.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GiB = 1 << 30


def evalm(*args, memory: int = 3 * GiB, timeout: float = 300, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`evalm ARGS` (the installed entry point's module) with at most `memory` bytes of address space."""
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "evalm.launcher.cli", *map(str, args)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=cap,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        end_group(proc.pid)
        out, err = proc.communicate()
        return subprocess.CompletedProcess(proc.args, 124, out, err + f"\n(timed out after {timeout} s)")
    finally:
        end_group(proc.pid)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def end_group(pgid: int) -> bool:
    """SIGKILL the process group `pgid` (a session started here); True if anything was left in it."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def user_error(done: subprocess.CompletedProcess) -> str:
    """The one line of a user error: exit 2, no `bug:` line, no traceback; returns that line."""
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    assert "bug:" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]
    return [line for line in done.stderr.splitlines() if line.strip()][-1]
