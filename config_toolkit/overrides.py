"""`section.key=value` overrides on top of a config file: `--set section.key=value` in every command,
`--section.key=value` its alias."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

from evalm.config_toolkit.errors import ConfigError


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply `section.key=value` overrides; values are parsed as TOML, else kept as strings."""
    out: dict[str, Any] = {k: dict(v) if isinstance(v, Mapping) else v for k, v in data.items()}
    for item in overrides:
        dotted, sep, raw = item.partition("=")
        if not sep or "." not in dotted:
            raise ConfigError(f"override {item!r}: expected section.key=value, e.g. model.d_model=64")
        *sections, key = dotted.strip().split(".")
        node = out
        for name in sections:
            node = node.setdefault(name, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {name!r} is not a section")
        try:
            node[key] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            node[key] = raw
        except RecursionError:  # tomllib recurses per nesting level: `[[[...]]]` thousands deep
            raise ConfigError(f"override {item!r}: nested deeper than the TOML reader can follow") from None
    return out


def split_overrides(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Overrides (returned as `section.key=value`) vs every other argument. One syntax everywhere:
    `--set section.key=value` (or `--set=section.key=value`); `--section.key=value` is its alias."""
    overrides, rest = [], []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--set":
            if not args:
                raise ConfigError("--set needs SECTION.KEY=VALUE, e.g. --set train.steps=10")
            overrides.append(args.pop(0))
        elif arg.startswith("--set="):
            overrides.append(arg[len("--set="):])
        elif arg.startswith("--") and "=" in arg and "." in arg.split("=", 1)[0]:
            overrides.append(arg[2:])
        else:
            rest.append(arg)
    return overrides, rest
