"""The subcommand dispatcher of every `evalm` command group (`evalm data|train|eval COMMAND`).

Subcommands are one dict, name -> (one-line help, function of the remaining arguments), as in
litgpt's PARSER_DATA: adding a command is adding an entry. `lazy` names the function by its module,
imported only when the command runs, so `--help` loads no torch.
"""

from __future__ import annotations

import contextlib
import importlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from evalm.config_toolkit.errors import report

Run = Callable[[Sequence[str]], int]


def lazy(target: str) -> Run:
    """`"package.module:function"` as a command function that imports its module when called."""
    module, _, name = target.partition(":")

    def run(argv: Sequence[str]) -> int:
        return getattr(importlib.import_module(module), name)(argv)

    run.__doc__ = f"Runs {target} (imported on first use)."
    return run


@dataclass(frozen=True)
class Dispatcher:
    """`prog COMMAND [ARGS...]`: usage on no argument or --help, a one-line error on an unknown command.

    What a command raises goes through `errors.report`: a project user error is one line `prog
    COMMAND: error: ...` (exit 2), anything else a bug line naming the log that holds its traceback
    (exit 1); --debug shows the traceback instead."""

    prog: str
    """What the user typed before COMMAND, e.g. "evalm train"; starts every message."""
    commands: Mapping[str, tuple[str, Run]]
    """Command name -> (one-line help, function of the remaining arguments returning an exit code)."""
    footer: str = ""
    """Text printed under the command table, e.g. where the docs are."""
    synopsis: str = "COMMAND [ARGS...]"
    """What follows `prog` on the usage line (e.g. global options before COMMAND)."""
    header: str = ""
    """A paragraph between the usage line and the command table."""

    def usage(self) -> str:
        width = max(map(len, self.commands))
        rows = "\n".join(f"  {name:<{width}}  {text}" for name, (text, _) in self.commands.items())
        header = f"{self.header}\n\n" if self.header else ""
        footer = f"\n{self.footer}\n" if self.footer else ""
        return f"usage: {self.prog} {self.synopsis}\n\n{header}commands:\n{rows}\n{footer}"

    def main(self, argv: Sequence[str] | None = None) -> int:
        argv = list(sys.argv[1:] if argv is None else argv)
        if not argv or argv[0] in ("-h", "--help", "help"):
            print(self.usage())
            return 0
        name, rest = argv[0], argv[1:]
        if name not in self.commands:
            print(f"{self.prog}: error: unknown command {name!r}; valid: {', '.join(self.commands)} "
                  f"(see {self.prog} --help)", file=sys.stderr)
            return 2
        try:
            with terminate_as_exit():
                return int(self.commands[name][1](rest) or 0)
        except KeyboardInterrupt:  # Ctrl-C is the user's own stop, not a failure: no traceback, the shell's 128 + 2
            print(f"{self.prog} {name}: interrupted", file=sys.stderr)
            return 130
        except Exception as err:  # noqa: BLE001 - the one rule: a user error in one line, else a bug with its log
            return report(f"{self.prog} {name}", err)


@contextlib.contextmanager
def terminate_as_exit() -> Iterator[None]:
    """SIGTERM (`kill PID`, `timeout`, a scheduler's stop) ends a command as Ctrl-C does: as an exception
    (SystemExit 143) raised in this process, so every `with` and `finally` on the way out runs. Without
    it the process vanishes at once, and the processes it started live on: datatrove's worker pool
    (`--workers N`) and its manager, decompressing and writing into a folder nobody holds. With it,
    the pool's `with` terminates and joins its workers and the manager is shut down, then the command
    exits. Signal handlers belong to the main thread; elsewhere (a command run in a thread) this does
    nothing, and the previous handler is restored after the command."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
