"""Reading a config file: TOML only (configs are data, never code)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from evalm.config_toolkit.errors import ConfigError
from evalm.config_toolkit.shipped import shipped


def read_toml(path: str | Path) -> dict[str, Any]:
    """Parse a TOML file, turning a missing file or a syntax error into a message with file and line.
    `configs/NAME.toml` falls back to the shipped config when it is not a file here (`shipped`)."""
    path = shipped(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
