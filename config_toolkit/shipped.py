"""The configs shipped inside the package, found from any working directory.

Commands, run files and the README name configs as `configs/NAME.toml`, a path relative to a
checkout. From a wheel installed elsewhere that path does not exist, so a relative `configs/...`
path that is not a file where it is given resolves to the file of the same name shipped as the
data package `evalm.configs` (named by string: it holds TOML only and imports nothing). A file that
exists where the user gave it always wins.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

PACKAGE = "evalm.configs"


def package_config(name: str) -> Path:
    """The config `name` shipped in the package, whatever the working directory holds: the built-in
    defaults of a command read this, so that a file of the same name where the command runs cannot
    change them (a user's own file is used only when they name it)."""
    return Path(str(resources.files(PACKAGE).joinpath(name)))


def shipped(path: str | Path) -> Path:
    """`path` itself, or the shipped config that `configs/NAME` names when `path` is not a file here."""
    path = Path(path)
    if path.exists() or path.is_absolute() or path.parts[:1] != ("configs",) or len(path.parts) < 2:
        return path
    try:
        candidate = resources.files(PACKAGE).joinpath(*path.parts[1:])
    except ModuleNotFoundError:
        return path
    return Path(str(candidate)) if candidate.is_file() else path
