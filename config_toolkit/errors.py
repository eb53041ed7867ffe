"""The one user-error class of every config, and the `--debug` switch that shows its traceback."""

from __future__ import annotations

import os


class ConfigError(ValueError):
    """A config file, flag or override that cannot be used; the message says where and what to do."""


def debug() -> bool:
    """`evalm --debug` (EVALM_DEBUG=1): user errors show their traceback instead of one line."""
    return os.environ.get("EVALM_DEBUG", "") not in ("", "0")
