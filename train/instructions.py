"""Instruction examples: the `{"task", "input", "output"}` rows `evalm train msit` reads, read and written here.

`iter_examples` streams them from any source `evalm.text.data_source` opens (columns mapped for FLAN
collections); `write_examples` writes them as jsonl with the default columns (`evalm data
samples` writes instructions/train.jsonl through it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from evalm.config_toolkit import InputError
from evalm.storage import write_atomic

MSIT_COLUMNS = {"task": "task", "input": "input", "output": "output"}
"""The fields of an instruction example and their default data columns."""
ROW_FORMAT = "{" + ", ".join(f'"{c}"' for c in MSIT_COLUMNS.values()) + "}"
"""The written rows, in words (a manifest's `format`)."""


@dataclass(frozen=True, slots=True)
class Example:
    task: str
    input: str
    output: str


def iter_examples(source: str | Path, columns: dict[str, str] = MSIT_COLUMNS) -> Iterator[Example]:
    """Examples one at a time from a file, saved folder or cached id (streamed: memory flat in the rows).

    `columns` maps `task`/`input`/`output` to the data's columns (FLAN: task_name, inputs, targets);
    a row that lacks one is an error naming the source, the row and the columns it has."""
    from evalm.text.data_source import iter_rows  # imports torch (evalm's package); the writer needs neither

    for number, row in enumerate(iter_rows(source), 1):
        values = {field: row.get(column) for field, column in columns.items()}
        missing = sorted(f"{columns[f]!r}" for f, v in values.items() if v is None)
        if missing:
            raise InputError(f"{source}: row {number} has no {', '.join(missing)} (it has {sorted(row)}); "
                             f"map data.columns (task/input/output) to its columns")
        yield Example(str(values["task"]), str(values["input"]), str(values["output"]))


def write_examples(path: Path, examples: Iterable[Example]) -> int:
    """One jsonl row per example, the MSIT_COLUMNS keys in order; returns the number written."""
    rows = [{MSIT_COLUMNS["task"]: e.task, MSIT_COLUMNS["input"]: e.input, MSIT_COLUMNS["output"]: e.output}
            for e in examples]
    write_atomic(path, b"".join(orjson.dumps(r) + b"\n" for r in rows))  # whole, never through a link
    return len(rows)
