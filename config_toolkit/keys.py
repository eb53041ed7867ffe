"""Every settable key of a command, with its default, for `--help`: a key that only the docs list
is a key users do not find. Read from the config dataclasses themselves, so the list cannot drift."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


def _shown(value) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(map(repr, value)) + "]"
    if dataclasses.is_dataclass(value):
        return "(a table)"
    return repr(value)


def settable_keys(sections: Mapping[str, type], how: str = "--set SECTION.KEY=VALUE") -> str:
    """A help epilog: `how`, then one `section.key = default` line per field of each section's class."""
    lines = [f"settable keys ({how}; values are TOML: 5, 1e-3, true, \"text\", [1, 2]):"]
    for section, cls in sections.items():
        for field in dataclasses.fields(cls):
            if field.default is not dataclasses.MISSING:
                default = _shown(field.default)
            elif field.default_factory is not dataclasses.MISSING:
                default = _shown(field.default_factory())
            else:
                default = "(required)"
            lines.append(f"  {section}.{field.name} = {default}")
    return "\n".join(lines)
