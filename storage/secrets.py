"""Secrets kept out of every file and line a run writes: `redis://user:***@host`.

A Redis URL may carry a password (`redis://:PASS@host:6379/0`, `rediss://user:PASS@host`,
`redis+cluster://:PASS@h1:7000,h2:7000`). The URL is needed to connect, but a run records its
command line (the lock file, config.json, manifest.json, datatrove's executor.json, the console
and error messages), and any of those may be shared with a report. `redact` is applied wherever
text that may hold a URL is recorded or printed, so the password never reaches disk or screen;
the connection itself uses the unredacted URL, which only lives in memory.

The rule is written once, for any `scheme://user:password@` in any text, so that a new place that
records a URL cannot forget one scheme.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

MASK = "***"
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^:@/\s]*):(?P<password>[^@\s]*)@")


def redact(text: str) -> str:
    """`text` with the password of every `scheme://user:password@` replaced by `***` (the user kept)."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line safe to record: each argument redacted."""
    return [redact(arg) for arg in argv]


def redact_value(value: Any) -> Any:
    """A JSON-like value (dict, list, str, number) with every string in it redacted; keys kept."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: redact_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(item) for item in value]
    return value


class Secret:
    """A URL held for connecting that shows only its redacted form: `str`, `repr`, f-strings and
    JSON encoders that fall back to `str` (datatrove's executor.json, which records every attribute
    of every pipeline step) all see `redis://user:***@host`; `reveal()` gives the URL to connect
    with. Pickled whole, so worker processes can connect."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __str__(self) -> str:
        return redact(self._value)

    def __repr__(self) -> str:
        return f"Secret({redact(self._value)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self):
        return (Secret, (self._value,))
