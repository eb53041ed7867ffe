"""Validation of one config section into its frozen pydantic dataclass, and back to a dict.

Unknown keys are refused here, before pydantic, so the message can name the file, the section,
the key and the valid keys; pydantic checks the types and each class's `__post_init__` the rest.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import pydantic

from evalm.config_toolkit.errors import ConfigError

T = TypeVar("T")
FROZEN = pydantic.ConfigDict(extra="forbid")
"""The `config=` of every config dataclass: extra keys are an error."""


def build(cls: type[T], section: Mapping[str, Any] | None, *, where: str) -> T:
    """Validate one section into `cls`; `where` names the file and section in errors.

    A field whose default is itself a config dataclass (e.g. the data filter's `default` profile)
    is built the same way from its sub-table, so its unknown keys are named as `where.field`.
    """
    section = dict(section or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(section) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; valid keys: {list(fields)}")
    hints = _hints(cls)
    for name, value in section.items():
        default = fields[name].default
        if isinstance(value, Mapping) and dataclasses.is_dataclass(default):
            section[name] = build(type(default), value, where=f"{where}.{name}")
        problem = _number_problem(hints.get(name), value)
        if problem:
            raise ConfigError(f"{where}: {name}: {problem}")
    try:
        return cls(**section)
    except pydantic.ValidationError as err:
        raise ConfigError(f"{where}: {'; '.join(_problem(e) for e in err.errors())}") from None
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """A config class's resolved annotations, once per class: resolving them compiles each one, and a study
    builds one `[[step]]` section per step (20,000 steps spent most of their load here)."""
    return typing.get_type_hints(cls)


def check_sections(data: Mapping[str, Any], known: Sequence[str], where: str) -> None:
    """The one rule for a command's sections, in every command: a top-level name that is none of
    `known` (dotted for sub-sections, e.g. `eval.method`) is an error naming it and the valid ones, so
    a misspelled `[evl]` or `--evl.seeds=[7]` is refused instead of ignored. A misspelled sub-section
    (`--eval.methd.scoring=...`) reaches `build` as a key of its section and is refused there."""
    tops = {name.split(".")[0] for name in known}
    unknown = sorted(set(data) - tops)
    if unknown:
        raise ConfigError(f"{where}: unknown section(s) {unknown}; valid sections: {list(known)}")


def check_overrides(overrides: Sequence[str], sections: Mapping[str, type]) -> None:
    """Each `section.key=value` override names a section of `sections` and a key of its class, else an error
    naming the override: a misspelled `--set trian.steps=1` or `--train.stpes=1` is the flag's mistake,
    and was reported as the `--config` file's (`FILE: unknown key(s) ...`), sending the user to a file
    that is fine. Sub-sections (`eval.method`) are matched longest first; a table-valued key
    (`filter.overrides."DM Mathematics".min_words`) is checked down to the key of its section."""
    for item in overrides:
        dotted = item.partition("=")[0].strip()
        parts = dotted.split(".")
        section = next((".".join(parts[:n]) for n in range(len(parts) - 1, 0, -1) if ".".join(parts[:n]) in sections),
                       None)
        if section is None:
            raise ConfigError(f"--set {item}: unknown section(s) {[parts[0]]}; valid sections: {list(sections)}")
        key = parts[len(section.split("."))]
        fields = [f.name for f in dataclasses.fields(sections[section])]
        if key not in fields:
            raise ConfigError(f"--set {item}: [{section}]: unknown key(s) {[key]}; valid keys: {fields}")


def _number_problem(hint: Any, value: Any) -> str | None:
    """What pydantic would let through but is never meant: a boolean where a number is expected
    (`steps=true` is not 1 step) and an infinite or NaN float (`lr=inf` trains to NaN). Checked on
    the value and, through tuples, lists and tables (a dict-valued setting such as the filter's
    per-subset `overrides`), on each element."""
    kinds = _scalar_kinds(hint)
    for v in _scalars(value):
        if isinstance(v, bool) and bool not in kinds and kinds & {int, float}:
            return f"expected a number, got {str(v).lower()} (booleans are not numbers)"
        if isinstance(v, float) and not math.isfinite(v):
            return f"expected a finite number, got {v}"
    return None


def _scalars(value: Any) -> list[Any]:
    """The leaves of a value: itself, or every element of its lists, tuples and tables, at any depth."""
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _scalars(v)]
    return [value]


def _scalar_kinds(hint: Any) -> set[type]:
    """The scalar types a field's annotation admits, through Optional, unions, tuples and lists."""
    if hint is None:
        return set()
    args = typing.get_args(hint)
    if not args:
        return {hint} if isinstance(hint, type) else set()
    if typing.get_origin(hint) is typing.Literal:
        return {type(a) for a in args}
    return set().union(*(_scalar_kinds(a) for a in args if a is not Ellipsis))


def _problem(error: Mapping[str, Any]) -> str:
    """One pydantic error as `key: message`, without pydantic's 'Value error, ' prefix."""
    message = str(error["msg"]).removeprefix("Value error, ")
    key = ".".join(map(str, error["loc"]))
    return f"{key}: {message}" if key else message


def to_dict(config: Any) -> dict[str, Any]:
    """A JSON-ready dict of a config dataclass (recorded as `config.json` in every output folder)."""
    return dataclasses.asdict(config)

