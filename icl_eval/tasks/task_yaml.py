"""YAML task files read as strictly as TOML ones: UTF-8, no key given twice, every failure one error.

PyYAML's `safe_load` keeps the last of two equal keys without a word (`labels:` twice is a task with
the second list, whatever the author meant), raises its own error types with a position, and recurses
once per nesting level. TOML refuses a repeated key, so a task file means the same thing whichever
format it is written in: here a repeated key is refused with its line, and a syntax error or a
nesting too deep for the parser is one error naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from evalm.config_toolkit import InputError


class _UniqueKeys(yaml.SafeLoader):
    """SafeLoader (plain data only) whose mappings refuse a key given twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(raw: bytes, path: Path) -> Any:
    """The data of a YAML task file, or InputError naming the file (and line)."""
    try:
        return yaml.load(raw.decode("utf-8"), Loader=_UniqueKeys)  # noqa: S506 - a SafeLoader subclass
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise InputError(f"{path}:{line}: not UTF-8 (byte 0x{raw[err.start]:02x}); save the file as UTF-8") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f":{mark.line + 1}" if mark is not None else ""
        raise InputError(f"{path}{at}: not valid YAML: {getattr(err, 'problem', None) or err}") from None
    except RecursionError:
        raise InputError(f"{path}: nested deeper than the YAML reader can follow; a task file is one flat "
                         "`task:` mapping") from None
