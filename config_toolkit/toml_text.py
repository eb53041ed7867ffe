"""TOML bytes into data: every way a file can fail to be TOML is one error naming it, never a bug.

`tomllib` raises three things a user's file can cause: `TOMLDecodeError` (a syntax error, a key given
twice), `UnicodeDecodeError` before it (TOML is UTF-8; a file saved as Latin-1 is not) and
`RecursionError` (its parser recurses once per nesting level, so `x = [[[...]]]` 3000 deep exhausts
Python's stack). Config files (`read_toml`) and task files read through here.
"""

from __future__ import annotations

import tomllib
from typing import Any

from evalm.config_toolkit.errors import ConfigError


def parse_toml(data: bytes | str, where: str) -> dict[str, Any]:
    """The tables of a TOML document; `where` (the file) starts every error."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as err:
            line = data[: err.start].count(b"\n") + 1
            raise ConfigError(f"{where}:{line}: not UTF-8 (byte 0x{data[err.start]:02x}); TOML files are UTF-8: "
                              "save the file as UTF-8") from None
    try:
        return tomllib.loads(data)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{where}: not valid TOML: {err}") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested deeper than the TOML reader can follow (arrays or tables inside "
                          "one another hundreds of levels deep); a config holds flat sections of values") from None
