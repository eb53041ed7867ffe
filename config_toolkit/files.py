"""Reading a config file: TOML only (configs are data, never code), and only a regular file of bounded size.

`read_bounded` is the one reader of every small file a command is handed (a config, a task file, a
model's config.json): a FIFO blocked the read forever and a link to `/dev/zero` filled memory, so
anything but a regular file (links followed) is refused, and a file past the stated size is refused
without being read past it.
"""

from __future__ import annotations

import errno
import stat
from pathlib import Path
from typing import Any

from evalm.config_toolkit.errors import ConfigError, InputError
from evalm.config_toolkit.shipped import shipped
from evalm.config_toolkit.toml_text import parse_toml


class NotRegular(InputError):
    """An input that must be a regular file is a FIFO, a device, a folder or a loop of links, or is too large."""


def kind_of(mode: int) -> str:
    """What a `stat` mode that is not a regular file is, in words."""
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a folder" if stat.S_ISDIR(mode) else "a special file"


def regular(path: str | Path, what: str = "this input") -> Path:
    """`path` when it is (or links to) a regular file; else NotRegular naming it (a FIFO would block the
    read forever, `/dev/zero` never ends, a loop of links names nothing). A missing file is the OS's error."""
    path = Path(path)
    try:
        mode = path.stat().st_mode  # follows links
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise NotRegular(f"{path}: a loop of symbolic links; point it at a file") from None
        raise
    if not stat.S_ISREG(mode):
        raise NotRegular(f"{path}: {kind_of(mode)}, not a regular file; {what} reads regular files only")
    return path


MiB = 1 << 20


def read_bounded(path: str | Path, limit: int, what: str = "this input") -> bytes:
    """The bytes of a regular file of at most `limit` bytes (`regular`); a larger one is refused without
    being read past the limit (its size may change while it is read: a file being written, a device)."""
    path = regular(path, what)
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise NotRegular(f"{path}: larger than {limit:,} bytes, the most {what} may hold (is it the file you "
                         "meant?)")
    return data


MAX_CONFIG_BYTES = 16 * MiB
"""A config or task file is kilobytes; a larger one is not the file meant."""


INCLUDE = "include"
"""Top-level key: config files whose tables this one starts from (its own values win), so a shape
shared by several run files (the tiny model) is written once."""


def read_toml(path: str | Path, _seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """Parse a TOML file, turning a missing file or a syntax error into a message with file and line.
    `configs/NAME.toml` falls back to the shipped config when it is not a file here (`shipped`);
    `include = ["configs/X.toml"]` merges X's tables under this file's own."""
    path = shipped(path)
    if not path.exists():
        raise ConfigError(f"{path}: config file not found")
    data = parse_toml(read_bounded(path, MAX_CONFIG_BYTES, "a config file"), str(path))  # a Latin-1 or 3000-deep file: one error
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
