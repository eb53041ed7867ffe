"""Recorded settings compared with a relaunch's: the dotted keys that differ, shown in one line.

A folder that holds finished work (a data stage's tasks, an evaluation's units) records what that
work was computed from. A relaunch with the same settings continues it; one with other settings
would mix two runs in one result, so it is refused, naming each differing key with its recorded and
its new value, and saying how to continue or start over (`RunFolder.record`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from evalm.config_toolkit import UserError

SHOWN = 5
"""Differing keys a refusal names (the rest are counted): the line stays one line."""


class SettingsChanged(UserError, ValueError):
    """A relaunch whose settings differ from those its folder's work was computed with."""


def as_read_back(value: Any) -> Any:
    """`value` as JSON gives it back (tuples as lists, paths and other objects as text)."""
    return json.loads(json.dumps(value, default=_plain, sort_keys=True))


def _plain(value: Any) -> Any:
    tolist = getattr(value, "tolist", None)  # numpy scalars and arrays: their Python values
    return tolist() if callable(tolist) else str(value)


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as {dotted key: leaf}; lists stay leaves."""
    if not isinstance(value, dict):
        return {prefix: value}
    out: dict[str, Any] = {}
    for k, v in value.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def differences(before: Any, now: Any, ignore: Sequence[str] = ()) -> list[str]:
    """The dotted keys whose values differ, sorted; keys in `ignore` (and under them) excepted."""
    a, b = flatten(before), flatten(now)
    return sorted(k for k in set(a) | set(b)
                  if a.get(k) != b.get(k) and not any(k == i or k.startswith(i + ".") for i in ignore))


def shown(value: Any) -> str:
    """A value short enough for a one-line refusal."""
    if isinstance(value, list) and len(value) > 3:
        return f"{len(value)} items"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe(before: Any, now: Any, keys: Sequence[str]) -> str:
    """`key: recorded X, now Y; ...` for the first SHOWN keys, then how many more."""
    a, b = flatten(before), flatten(now)
    text = "; ".join(f"{k}: recorded {shown(a.get(k))}, now {shown(b.get(k))}" for k in keys[:SHOWN])
    return text + (f" (+{len(keys) - SHOWN} more)" if len(keys) > SHOWN else "")
