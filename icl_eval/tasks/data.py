"""A task's train/validation/test rows, read through `datasets` offline (docs/evaluation.md).

`--data` (or `[eval] data`) is one of:
- a folder of split files (`train.jsonl`, `dev.csv`, `test.parquet`, or `train/` saved folders);
- a `save_to_disk` folder of a `DatasetDict`;
- a dataset id `id[/config]` from the local `datasets` cache (`glue/sst2`, `SetFit/sst5`).
Without `--data`, a task file's own split files are read, and a built-in task reads the dataset
its table entry names (`tasks.EVALM_TASKS[...].dataset`), with that entry's split mapping: where
the hub's test labels are hidden, the labelled validation split is scored as test (docs/evaluation.md).

Rows stay in Arrow (memory-mapped) behind a small sequence, so MNLI's 393k training rows are not
turned into Python dicts until a demonstration is drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from evalm.config_toolkit import ConfigError
from evalm.config_toolkit.files import regular
from evalm.text.data_source import FILE_BUILDERS, DataSourceError, is_dataset_dict, is_saved_dataset, open_source
from evalm.icl_eval.tasks.task import SPLITS, Task, task_table, get_task

Splits = dict[str, "Rows"]


class Rows(Sequence):
    """A read-only list of dict rows over a `datasets.Dataset` (memory-mapped Arrow)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Rows(self.dataset.select(range(*i.indices(len(self)))))
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        return self.dataset[i]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.dataset)

    def __eq__(self, other) -> bool:
        return list(self) == list(other)

    @property
    def columns(self) -> list[str]:
        return list(self.dataset.column_names)


def read_split(path: str | Path) -> Rows:
    """One split: a jsonl/json/csv/parquet file (a regular file: a FIFO would hang the read) or a
    `save_to_disk` folder of one `Dataset`."""
    if Path(path).exists() and not Path(path).is_dir():
        regular(path, "a task's split")
    data = open_source(path)
    if is_dataset_dict(data):
        raise DataSourceError(f"{path}: a DatasetDict ({sorted(data)}); pass it as --data, not as one split")
    return Rows(data)


def find_splits(folder: str | Path) -> dict[str, Path]:
    """Split name -> file or saved folder inside a data folder (`train.jsonl`, `dev.csv`, `test/` ...)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataSourceError(f"{folder}: data folder not found")
    found: dict[str, Path] = {}
    for split in SPLITS:
        aliases = (split, "dev") if split == "validation" else (split,)
        for alias in aliases:
            for suffix in (*FILE_BUILDERS, ""):
                candidate = folder / f"{alias}{suffix}"
                if candidate.exists() and split not in found:
                    found[split] = candidate
    if not found:
        raise DataSourceError(f"{folder}: no train/validation/test {'/'.join(FILE_BUILDERS)} files or saved folders")
    return found


def load_splits(files: dict[str, Path]) -> Splits:
    return {split: read_split(path) for split, path in files.items()}


def task_data_files(path: str | Path) -> dict[str, Path]:
    """The split files or data folder named in a task file, resolved against the file's folder."""
    spec, base = task_table(path), Path(path).parent
    out = {s: base / spec[s] for s in SPLITS if s in spec}
    if "data" in spec:
        out.update(find_splits(base / spec["data"]))
    return out


@dataclass(frozen=True)
class SeedSplits:
    """The splits each demonstration seed draws from, and a declared fact the bootstrap depends on:
    whether every seed scores the same test items (`shares_test`, a crossed design: a fixed data
    set) or each seed has its own (nested: the synthetic family's fresh episode per seed). Declared,
    not inferred from object identity, so copying the splits cannot change an interval."""

    for_seed: Callable[[int], Splits]
    shares_test: bool

    def __call__(self, seed: int) -> Splits:
        return self.for_seed(seed)


def _same(splits: Splits) -> Callable[[int], Splits]:
    def for_seed(seed: int) -> Splits:
        return splits

    return for_seed


def resolve_task(config, synthetic, tiny_model: bool) -> tuple[Task, SeedSplits, dict[str, Any]]:
    """The task `[eval] task` names, its splits per seed, and where its data came from.

    `synthetic` (a SyntheticConfig) draws a fresh rule per seed; any other task reads its splits once
    and every seed shares them. The built-in tiny model (`tiny_model`) knows only `synthetic`."""
    if config.task == "synthetic":
        from evalm.icl_eval.tasks.synthetic import episode, synthetic_task

        return (synthetic_task(synthetic), SeedSplits(partial(_episode, synthetic=synthetic, make=episode), False),
                {"source": "synthetic"})
    if tiny_model:
        raise ConfigError("--task: a real task needs --checkpoint DIR or --hf-model DIR "
                          "(the built-in tiny model knows only `synthetic`)")
    task = get_task(config.task, config.template_set)
    splits, data_info = task_splits(task, config.task, config.data)
    return with_data_labels(task, splits, data_info), SeedSplits(_same(splits), True), data_info


def _episode(seed: int, synthetic, make) -> Splits:
    return make(seed, synthetic)


def with_data_labels(task: Task, splits: Splits, info: dict[str, Any]) -> Task:
    """A `labels_from_data` task with its verbalizer: the label column's class names, in index order."""
    if not task.labels_from_data or task.labels:
        return task
    import dataclasses

    column = task.column(task.label_field)
    feature = splits["train"].dataset.features.get(column)
    names = getattr(feature, "names", None)
    if not names:
        raise DataSourceError(f"{info['source']}: column {column!r} carries no label names (not a datasets "
                              f"ClassLabel), and task {task.name!r} reads its labels from them; give the dataset "
                              "as published (its ClassLabel column) or a task file with `labels`")
    return dataclasses.replace(task, labels=tuple(str(n) for n in names))


def task_splits(task: Task, task_arg: str, data: str | None) -> tuple[Splits, dict[str, Any]]:
    """The rows of each protocol split and what was read (`results.json` protocol.data)."""
    if data:
        splits, info = _from_data(task, data)
    elif Path(task_arg).suffix in (".toml", ".yaml", ".yml"):
        files = task_data_files(task_arg)
        splits, info = load_splits(files), {"source": task_arg, "splits": {s: str(p) for s, p in files.items()}}
    elif task.dataset is not None:
        splits, info = _from_hub(task, task.dataset.ids[0], fallbacks=task.dataset.ids[1:])
    else:
        raise DataSourceError(f"task {task.name!r} names no dataset: give --data (a folder, saved dataset or id)")
    if "train" not in splits or "test" not in splits:
        raise DataSourceError(f"{info['source']}: need train and test splits, found {sorted(splits)}")
    for split, rows in splits.items():
        check_fields(task, rows, info.get("splits", {}).get(split, f"{info['source']} split {split!r}"))
    return splits, info


MAX_FIELD_CHARS = 1 << 20
"""The longest text a row's field may hold (a million characters, hundreds of pages): a many-shot prompt
repeats each demonstration, so one 2 MiB item took gigabytes, or hours, before any score."""


def check_fields(task: Task, rows: Rows, where: str) -> None:
    """Every field the template and label need, in every row, as text of at most MAX_FIELD_CHARS: else the
    file and line (row) to fix.

    A jsonl row without a key still loads (the column holds None there), so rows are checked
    one column at a time; a jsonl file is named by line (row + 1), other sources by row."""
    if not len(rows):
        return
    first = rows[0]
    needed = [task.column(f, first) for f in [*task.input_fields, *task.choice_fields]]
    needed.append(task.column(task.label_field, first))
    for column in dict.fromkeys(needed):
        if column not in rows.columns:
            raise DataSourceError(f"{where}: no field {column!r} (task {task.name!r} needs it; the rows have "
                                  f"{rows.columns}); rename it in the data or map it with `field_aliases` in the task")
        values = rows.dataset[column]
        if None in values:
            raise DataSourceError(f"{where}: {_at(where, values.index(None))} has no {column!r}; add it or remove the row")
        long = next((i for i, v in enumerate(values) if isinstance(v, str) and len(v) > MAX_FIELD_CHARS), None)
        if long is not None:
            raise DataSourceError(f"{where}: {_at(where, long)}: {column!r} holds {len(values[long]):,} characters, more than "
                                  f"the {MAX_FIELD_CHARS:,} an item may hold; shorten or remove the row")


def _at(where: str, row: int) -> str:
    """A row as the user finds it: a jsonl file by line, other sources by row."""
    return f"line {row + 1}" if str(where).endswith(".jsonl") else f"row {row} (counting from 0)"


def _from_data(task: Task, data: str) -> tuple[Splits, dict[str, Any]]:
    path = Path(data)
    if path.is_dir() and not is_saved_dataset(path):
        files = find_splits(path)
        return load_splits(files), {"source": data, "splits": {s: str(p) for s, p in files.items()}}
    if path.exists():
        return _mapped(open_source(path), data, None, "")
    return _from_hub(task, data)


def _from_hub(task: Task, spec: str, fallbacks: Sequence[str] = ()) -> tuple[Splits, dict[str, Any]]:
    """A cached id; the task's split mapping applies when the id is the task's own dataset."""
    ref = task.dataset
    own = ref is not None and any(spec == i or spec.startswith(f"{i}/") for i in ref.ids)
    if own and ref.config and spec in ref.ids:
        spec = f"{spec}/{ref.config}"
    try:
        data = open_source(spec)
        if own and ref.test_fraction and is_dataset_dict(data) and "test" not in data:
            data = data["train"].train_test_split(test_size=ref.test_fraction, seed=ref.split_seed)
    except DataSourceError:
        if not fallbacks:
            raise
        try:
            return _from_hub(task, fallbacks[0], fallbacks[1:])
        except DataSourceError:
            pass
        raise
    return _mapped(data, spec, ref.splits if own else None, ref.note if own else "")


def _mapped(data, source: str, mapping: dict[str, str] | None, note: str) -> tuple[Splits, dict[str, Any]]:
    """Protocol split -> Rows of the dataset split it maps to (by name when no mapping)."""
    if not is_dataset_dict(data):
        raise DataSourceError(f"{source}: one split only; ICL needs train and test (a DatasetDict or a folder)")
    mapping = mapping or {s: s for s in SPLITS if s in data}
    missing = sorted(v for v in mapping.values() if v not in data)
    if missing:
        raise DataSourceError(f"{source}: no split(s) {missing}; it has {sorted(data)}")
    info = {"source": source, "splits": dict(mapping)}
    if note:
        info["note"] = note
    return {split: Rows(data[name]) for split, name in mapping.items()}, info
