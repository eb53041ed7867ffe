"""Reading a config file: TOML only (configs are data, never code)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evalm.config_toolkit.errors import ConfigError
from evalm.config_toolkit.shipped import shipped
from evalm.config_toolkit.toml_text import parse_toml


INCLUDE = "include"
"""Top-level key: config files whose tables this one starts from (its own values win), so a shape
shared by several run files (the tiny model) is written once."""


def read_toml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Parse a TOML file, turning a missing file or a syntax error into a message with file and line.
    `configs/NAME.toml` falls back to the shipped config when it is not a file here (`shipped`);
    `include = ["configs/X.toml"]` merges X's tables under this file's own."""
    path = shipped(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    data = parse_toml(path.read_bytes(), str(path))  # a Latin-1 or 3000-deep file is one error naming it
    includes = data.pop(INCLUDE, [])
    if isinstance(includes, str) or not all(isinstance(i, str) for i in includes):
        raise ConfigError(f"{path}: {INCLUDE} must be a list of config files, e.g. [\"configs/model-tiny.toml\"]")
    merged: dict[str, Any] = {}
    for name in includes:
        if shipped(name).resolve() in (*_seen, path.resolve()):
            raise ConfigError(f"{path}: {INCLUDE} {name!r} includes itself")
        merged = _merge(merged, read_toml(name, (*_seen, path.resolve())))
    return _merge(merged, data)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over`'s values on top of `base`, table by table."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out
