"""Secrets kept out of every file and line a run writes: `redis://user:***@host`.

A Redis URL may carry a password in several spellings, all of which Redis clients accept:

- user-info: `redis://:PASS@host:6379/0`, `rediss://user:PASS@host`, `redis+cluster://:PASS@h1:7000,h2:7000`
  (a password may itself hold `@`, `:` or `/`, raw or percent-encoded: `p%40ss`);
- a query parameter: `redis://alice@host/0?password=PASS` (redis-py reads any query key as a
  connection argument);
- the whole URL percent-encoded inside another one or in a log (`redis%3A%2F%2F%3APASS%40host`).

The URL is needed to connect, but a run records its command line (the lock file, config.json,
manifest.json, datatrove's executor.json, the console and error messages), and any of those may be
shared with a report. `redact` is applied wherever text that may hold a URL is recorded or printed,
so the password never reaches disk or screen; the connection itself uses the unredacted URL, which
only lives in memory (`Secret`). Beyond the URL rules, every password a `Secret` of this process has
held (raw, percent-decoded and percent-encoded) is masked wherever it appears, so a library that
prints the decoded password on its own is covered too.

The rule is written once, for any scheme, so that a new place that records a URL cannot forget a spelling.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote, unquote, urlsplit

MASK = "***"
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<info>[^\s/?#]*)@")
"""`scheme://` then the user-info up to the last `@` before the host (a raw `@` in a password included)."""
_ENCODED = re.compile(r"(?i)(?P<scheme>[a-z][a-z0-9+.\-]*%3A%2F%2F)(?P<info>(?:(?!%2F|%3F|%23)[^\s/?#&])*)%40")
"""The same inside a percent-encoded URL: `%3A%2F%2F` for `://`, `%40` for `@`, `%3A` for `:`."""
_QUERY = re.compile(r"(?i)(?P<key>(?:[?&;]|%3F|%26)(?:password|passwd|pass|pwd|auth|token|secret)(?:=|%3D))"
                    r"(?P<value>[^&\s#;]*)")
"""A password given as a query parameter (`?password=...`), plain or percent-encoded."""
_VAR = re.compile(r"(?i)(?P<key>\bvars\.(?P<name>[a-z0-9_]+)(?:=|%3D))(?P<value>\S*)")
"""A study's var set on the command line (`--set study.vars.NAME=VALUE`), masked when its name looks secret."""
SECRET_NAME = re.compile(r"(?i)pass|pw|secret|token|key")
"""A name that says its value is a credential (`password`, `db_pw`, `api_key`, `hf_token`)."""
_KNOWN: set[str] = set()
"""Passwords `Secret`s of this process hold, in each spelling: masked wherever they appear."""


def _info(match: re.Match, colon: str) -> str:
    info = match["info"]
    user, sep, _ = info.partition(colon)
    return f"{match['scheme']}{user}{colon}{MASK}@" if sep else match[0]


def redact(text: str) -> str:
    """`text` with every password in a URL replaced by `***` (user names kept), in every spelling above."""
    text = _USERINFO.sub(lambda m: _info(m, ":"), text)
    text = _ENCODED.sub(lambda m: _info(m, "%3A").replace(f"%3A{MASK}@", f"%3A{MASK}%40"), text)
    text = _QUERY.sub(lambda m: f"{m['key']}{MASK}", text)
    text = _VAR.sub(lambda m: f"{m['key']}{MASK}" if SECRET_NAME.search(m["name"]) else m[0], text)
    for secret in sorted(_KNOWN, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line safe to record: each argument redacted; a secret-looking var's whole value masked, spaces
    and all (`--set "study.vars.pw=two words"` is one argument)."""
    return [_whole_var(redact(arg)) for arg in argv]


def _whole_var(arg: str) -> str:
    match = _VAR.search(arg)
    return arg[:match.end("key")] + MASK if match and SECRET_NAME.search(match["name"]) else arg


def looks_secret(name: str, value: str) -> bool:
    """Whether a named value (a study's var) is a credential: its name says so, or it is a URL with a password."""
    return bool(SECRET_NAME.search(name)) or redact(value) != value


def redact_value(value: Any) -> Any:
    """A JSON-like value (dict, list, str, number) with every string in it redacted; keys kept."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: redact_value(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_value(item) for item in value]
    return value


MIN_KNOWN = 4
"""Shorter passwords are masked only inside URLs: masking every `abc` in every text would maul it."""


def remember(url: str) -> None:
    """Note the passwords in `url` (user-info and query, each spelling) so that `redact` masks them anywhere."""
    for part in url.split(","):  # redis+cluster://:P@h1,h2 and several comma-joined URLs
        try:
            split = urlsplit(part.strip())
            found = [split.password or ""]
        except ValueError:
            continue
        found += [m["value"] for m in _QUERY.finditer(part)]
        for raw in found:
            for spelling in (raw, unquote(raw), quote(unquote(raw), safe="")):
                if len(spelling) >= MIN_KNOWN:
                    _KNOWN.add(spelling)


class Secret:
    """A URL held for connecting that shows only its redacted form: `str`, `repr`, f-strings and
    JSON encoders that fall back to `str` (datatrove's executor.json, which records every attribute
    of every pipeline step) all see `redis://user:***@host`; `reveal()` gives the URL to connect
    with. Pickled whole, so worker processes can connect (and mask its password in their own logs)."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value
        remember(value)

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
