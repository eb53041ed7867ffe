"""The console of `evalm run`: a stage's own output goes to its log file, progress bars stay.

datatrove logs through loguru to whatever stderr object is current when a task starts, and every
command prints its own lines; the launcher shows `stage k/N`, progress bars and one result line per
stage, so the rest of a stage's output is written to its log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

from evalm.config_toolkit import UserError
from evalm.launcher.commands import dispatch
from evalm.storage import redact_argv
from evalm.storage.files import appended


class StageFailed(UserError, RuntimeError):
    """A stage's command exited with an error, which it printed to the stage's log."""


def call(argv: list, log: Path, step: str | None = None) -> None:
    """Run one command in this process; its printed lines and the data library's log lines go to
    the stage's log file, while progress bars (stderr) stay on the console. An error names the log."""
    with appended(log) as f:  # never through a link
        f.write(log_header(argv))
        f.flush()
        with _quiet(f):
            code = dispatch(argv)
    check_exit(code, argv, log, step)


def _shown(argv: list) -> str:
    """The command as the log and the screen show it: a --redis-url password reaches neither."""
    return " ".join(redact_argv(map(str, argv)))


def log_header(argv: list) -> str:
    return f"\n$ evalm {_shown(argv)}\n"


def check_exit(code: int, argv: list, log: Path, step: str | None = None) -> None:
    """A command's exit status as `evalm run` reports it: 0 passes, 130 is Ctrl-C, 1 a bug of ours
    (config_toolkit.report), anything else the user's error, each naming the step, if given, and the log."""
    shown = f"{_shown(argv)}` (step {step!r})" if step else f"{_shown(argv)}`"
    if code in (130, -signal.SIGINT):  # Ctrl-C inside the command (a training stage keeps its last complete
        raise KeyboardInterrupt        # checkpoint); -SIGINT: a child process that let the KeyboardInterrupt out
    if code < 0:  # killed by a signal: the out-of-memory killer's SIGKILL, most often
        why = "; free memory (or lower [run] jobs)" if -code == signal.SIGKILL else ""
        raise StageFailed(f"`evalm {shown} was killed by {signal.Signals(-code).name}; its output is in {log}{why}; "
                          "then rerun `evalm run` to resume")
    if code == 1:  # config_toolkit.report: a bug of ours, its traceback in a file the log names
        raise StageFailed(f"`evalm {shown} stopped on an internal error (a bug, not your input); "
                          f"its output in {log} names the file with the traceback; please report it with that file")
    if code:
        raise StageFailed(f"`evalm {shown} exited with {code}; its output is in {log}; "
                           f"fix the error, then rerun `evalm run`")


@contextlib.contextmanager
def _quiet(f):
    """stdout and datatrove's loguru lines (it logs to the stderr object of the moment) into `f`.

    datatrove runs tasks in worker processes, which write to file descriptor 2 itself, so fd 2 is
    pointed at the log for the stage and the console keeps a duplicate of the terminal for the
    progress bars of this process."""
    from loguru import logger

    sys.stderr.flush()
    saved_fd = os.dup(2)
    console = os.fdopen(saved_fd, "w", buffering=1, encoding="utf-8", errors="replace")
    saved_stderr = sys.stderr
    logger.remove()  # datatrove's tasks replace the handlers themselves, so reset them all after
    logger.add(f, level="INFO")
    try:
        os.dup2(f.fileno(), 2)
        with contextlib.redirect_stdout(f):
            sys.stderr = _ProgressOnly(console, f)
            yield
    finally:
        sys.stderr = saved_stderr
        os.dup2(saved_fd, 2)
        console.close()
        logger.remove()
        logger.add(sys.stderr, level="INFO")


class _ProgressOnly:
    """A stderr that shows progress bars (carriage-return updates) and sends whole lines to the log."""

    def __init__(self, console, log):
        self.console, self.log = console, log
        self.bar_open = False  # a bar is on the console's last line: its closing newline goes there too

    def write(self, text: str) -> int:
        if "\r" in text:
            self.console.write(text)
            self.bar_open = True
        elif self.bar_open and not text.strip():
            self.console.write(text)
            self.bar_open = False
        else:
            self.log.write(text)
        return len(text)

    def flush(self) -> None:
        self.console.flush()
        self.log.flush()

    def isatty(self) -> bool:
        return self.console.isatty()

    def fileno(self) -> int:
        return self.log.fileno()
