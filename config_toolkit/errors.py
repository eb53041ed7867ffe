"""The one user-error class of every config, and the `--debug` switch that shows its traceback."""

from __future__ import annotations

import os
import sys


class ConfigError(ValueError):
    """A config file, flag or override that cannot be used; the message says where and what to do."""


def debug() -> bool:
    """`evalm --debug` (EVALM_DEBUG=1): user errors show their traceback instead of one line."""
    return os.environ.get("EVALM_DEBUG", "") not in ("", "0")


def report(prog: str, err: BaseException) -> int:
    """Inside an `except` for a user's mistake: under --debug re-raise it (traceback), else print it as
    one line `prog: error: ...` on stderr; returns the exit code 2."""
    if debug():
        raise err
    print(f"{prog}: error: {err}", file=sys.stderr)
    return 2
