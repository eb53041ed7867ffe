"""The subcommand dispatcher of every `evalm` command group (`evalm data|train|eval COMMAND`).

Subcommands are one dict, name -> (one-line help, function of the remaining arguments), as in
litgpt's PARSER_DATA: adding a command is adding an entry. `lazy` names the function by its module,
imported only when the command runs, so `--help` loads no torch.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from evalm.config_toolkit.errors import debug

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
    """`prog COMMAND [ARGS...]`: usage on no argument or --help, a one-line error on an unknown command."""

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
    user_errors: tuple[type[BaseException], ...] = ()
    """Errors a user can fix, reported as one line `prog COMMAND: error: ...` with exit code 2 (unless --debug)."""

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
            return int(self.commands[name][1](rest) or 0)
        except self.user_errors as err:
            if debug():
                raise
            message = err.args[0] if isinstance(err, KeyError) and err.args else err  # KeyError's str() adds quotes
            print(f"{self.prog} {name}: error: {message}", file=sys.stderr)
            return 2
