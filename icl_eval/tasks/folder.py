"""The task folder: `task.toml` plus one jsonl file per split, written here and read by
`tasks.read_task_file` (the Task) and `task_data.task_data_files` (the split files).

The `[task]` table holds the Task fields that differ from their defaults, in Task's field order,
and one key per split naming its file; reading the folder back gives the same Task
(tests/icl_eval/test_task_folder.py).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from evalm.config_toolkit import MissingInput
from evalm.icl_eval.tasks.task import SPLITS, Task
from evalm.storage import write_atomic

TASK_FILE = "task.toml"


def toml_value(value: Any) -> str:
    """A TOML value for a Task field: string, number or bool, array, inline table (JSON escapes are TOML's)."""
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def task_toml(task: Task, split_files: dict[str, str], comment: Sequence[str] = ()) -> str:
    """The `[task]` table of a Task with its split file names, after `# ` comment lines."""
    if task.dataset is not None:
        raise ValueError(f"task {task.name!r}: a task file names split files, not a hub dataset ({task.dataset.ids})")
    lines = [f"# {line}" for line in comment] + ["[task]"]
    for f in dataclasses.fields(Task):
        value = getattr(task, f.name)
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if value != default:
            lines.append(f"{f.name} = {toml_value(value)}")
    lines += [f"{split} = {json.dumps(name)}" for split, name in split_files.items()]
    return "\n".join(lines) + "\n"


def write_task_folder(folder: Path, task: Task, splits: dict[str, Sequence[dict[str, Any]]],
                      comment: Sequence[str] = ()) -> tuple[Path, dict[str, Path]]:
    """`<split>.jsonl` for each split given (in SPLITS order) and task.toml naming them;
    returns (task file, split -> file)."""
    folder.mkdir(parents=True, exist_ok=True)
    unknown = sorted(set(splits) - set(SPLITS))
    if unknown:
        raise ValueError(f"task {task.name!r}: unknown split(s) {unknown}; valid: {list(SPLITS)}")
    files = {}
    for split in (s for s in SPLITS if s in splits):
        files[split] = folder / f"{split}.jsonl"
        write_atomic(files[split], b"".join(orjson.dumps(row) + b"\n" for row in splits[split]))
    task_file = folder / TASK_FILE
    write_atomic(task_file, task_toml(task, {s: p.name for s, p in files.items()}, comment))
    return task_file, files


def lead_rows(splits: dict[str, list[dict[str, Any]]], lead_words: int) -> dict[str, list[dict[str, Any]]]:
    """Every row's text cut to its first `lead_words` words (its lead: a news body's first sentence or two)."""
    return {s: [{**r, "text": " ".join(r["text"].split()[:lead_words])} for r in rows] for s, rows in splits.items()}


def write_lead_task(task_file: Path, lead_words: int) -> Path:
    """A copy of the task folder of `task_file` named `<name>-lead<N>`, beside it, with every text cut to its
    lead (`lead_rows`), so that `evalm eval icl --task` reads the cut a script's own runs read (bbc_news's
    bodies at 32 words: ~45 tokens a demonstration, so 256 shots cross an 8k window). Returns its task.toml."""
    from evalm.icl_eval.tasks.data import load_splits, task_data_files

    if not task_file.is_file():
        raise MissingInput(f"{task_file} not found: a task folder's task.toml (`evalm data samples --output DIR` "
                           "writes DIR/tasks/NAME/task.toml)")
    name = task_file.parent.name
    splits = lead_rows(load_splits(task_data_files(task_file)), lead_words)
    folder = task_file.parent.parent / f"{name}-lead{lead_words}"
    folder.mkdir(parents=True, exist_ok=True)
    toml = task_file.read_text(encoding="utf-8").replace(f'name = "{name}"', f'name = "{name}-lead{lead_words}"')
    write_atomic(folder / TASK_FILE, f"# {task_file} with each text cut to its first {lead_words} words "
                                     f"(icl_eval.tasks.folder.write_lead_task)\n" + toml)  # never through a link
    for split, rows in splits.items():
        write_atomic(folder / f"{split}.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return folder / TASK_FILE
