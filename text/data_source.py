"""Data where researchers keep it, read with Hugging Face `datasets`, offline.

A *source* is one of:
- a folder written by `save_to_disk` (a `Dataset` or a `DatasetDict`), memory-mapped;
- a local `.jsonl` / `.json` / `.csv` / `.parquet` file, read by `load_dataset`'s file builders;
- a dataset id with an optional config and split, `id[/config][:split]` (`glue/sst2`,
  `super_glue/boolq`, `SetFit/sst5`, `deepmind/pg19:test`), resolved from the local `datasets`
  cache, where `load_dataset` left it on a machine with network.

Hub access is off (`datasets_module`; the command line sets `HF_HUB_OFFLINE=1` unless the user
set it, `config_toolkit.environment`): nothing is downloaded. A dataset missing from the cache is one error
naming the id and the command that fetches it. This module sits on the ground floor
(`text/`, beside the model) because `train/` (instruction data) and `icl_eval/` (tasks, books)
both read through it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalm.config_toolkit import ConfigError
from evalm.config_toolkit.environment import hub_offline

FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
"""File suffix -> `load_dataset` packaged builder."""


class DataSourceError(ConfigError):
    """A source that cannot be read offline; the message names it and what to do."""


@dataclass(frozen=True)
class HubSpec:
    """One reading of `id[/config][:split]`."""

    repo: str
    config: str | None = None
    split: str | None = None

    def __str__(self) -> str:
        return self.repo + (f"/{self.config}" if self.config else "") + (f":{self.split}" if self.split else "")


def hub_candidates(spec: str) -> list[HubSpec]:
    """The readings of a spec, most specific first: `a/b` is the id `a/b`, else id `a` with config `b`."""
    name, _, split = spec.partition(":")
    parts = [p for p in name.split("/") if p]
    if not parts or len(parts) > 3:
        raise DataSourceError(f"{spec!r}: expected a local path or a dataset id `id[/config][:split]`")
    split_or_none = split or None
    if len(parts) == 1:
        return [HubSpec(parts[0], None, split_or_none)]
    if len(parts) == 2:
        return [HubSpec("/".join(parts), None, split_or_none), HubSpec(parts[0], parts[1], split_or_none)]
    return [HubSpec("/".join(parts[:2]), parts[2], split_or_none)]


def cache_dir() -> Path:
    """The `datasets` cache, read from the environment at call time (tests point HF_HOME elsewhere)."""
    if os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "datasets"


FETCH_NOTES: dict[str, tuple[str, str]] = {
    # hub repos still holding a loading script, which `datasets>=4` refuses (repo -> (before, extra argument))
    "CogComp/trec": ("", "revision='refs/convert/parquet'"),  # the hub's parquet conversion: config `default`
    "deepmind/pg19": ("pip install 'datasets<4' && ", "trust_remote_code=True"),  # its parquet branch is empty
}
"""How to fetch repos whose main branch `load_dataset` cannot read; their cache reads here like any other."""


def fetch_command(spec: HubSpec) -> str:
    """What to run on a machine with network so that `spec` is in the cache afterwards."""
    before, extra = FETCH_NOTES.get(spec.repo, ("", ""))
    args = ", ".join([repr(a) for a in (spec.repo, spec.config) if a] + ([extra] if extra else []))
    return f"{before}HF_HOME=DIR python -c \"import datasets; datasets.load_dataset({args})\""


def datasets_module():
    """`datasets`, with hub access off (unless the user switched it on) even if it was imported before the
    command line set its environment (both libraries read the variables once, at import)."""
    import datasets
    import huggingface_hub.constants

    datasets.config.HF_HUB_OFFLINE = huggingface_hub.constants.HF_HUB_OFFLINE = hub_offline()
    datasets.utils.logging.set_verbosity_error()  # "Using the latest cached version..." on every read
    datasets.disable_progress_bars()
    return datasets


def is_dataset_dict(data) -> bool:
    """A `DatasetDict` (split name -> dataset) rather than one split."""
    return hasattr(data, "keys") and not hasattr(data, "features")


def is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file())


def open_source(source: str | Path, split: str | None = None, streaming: bool = False):
    """A `Dataset`/`IterableDataset` (one split) or a `DatasetDict` (split None and several present).

    streaming=True reads local files lazily (row groups / lines, no Arrow copy in the cache); a
    saved folder or a cached id is Arrow on disk already and is memory-mapped, never loaded whole.
    """
    path = Path(source)
    if path.exists():
        return _open_local(path, split, streaming)
    if path.suffix in FILE_BUILDERS or str(source).startswith(("/", ".", "~")):
        raise DataSourceError(f"{source}: no such file or folder")
    return open_hub(str(source), split)


def _open_local(path: Path, split: str | None, streaming: bool):
    ds = datasets_module()
    if is_saved_dataset(path):
        data = ds.load_from_disk(str(path))
        if split is None or isinstance(data, ds.Dataset):
            return data
        if split not in data:
            raise DataSourceError(f"{path}: no split {split!r}; it has {sorted(data)}")
        return data[split]
    if path.suffix not in FILE_BUILDERS:
        raise DataSourceError(f"{path}: not a save_to_disk folder nor a {'/'.join(FILE_BUILDERS)} file")
    name = split or "train"
    try:
        data = ds.load_dataset(FILE_BUILDERS[path.suffix], data_files={name: str(path)}, split=name,
                               streaming=streaming, cache_dir=str(cache_dir()))
        if path.suffix == ".json" and list(data.column_names or ()) == ["data"]:  # {"data": [rows]} (SQuAD style)
            data = ds.load_dataset("json", data_files={name: str(path)}, split=name, field="data",
                                   streaming=streaming, cache_dir=str(cache_dir()))
        return data
    except Exception as err:  # pyarrow/pandas parse errors: name the file, not a traceback
        raise DataSourceError(f"{path}: cannot be read as {FILE_BUILDERS[path.suffix]} ({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''})") from None


def open_hub(spec: str, split: str | None = None):
    """A dataset id from the offline cache; the first reading of `spec` that the cache holds wins."""
    ds = datasets_module()
    misses = []
    for cand in hub_candidates(spec):
        try:
            return ds.load_dataset(cand.repo, cand.config, split=split or cand.split, cache_dir=str(cache_dir()))
        except (ConnectionError, FileNotFoundError):  # not cached at all (the offline hub lookup failed)
            misses.append((cand, ""))
        except ValueError as err:  # cached, but not this config or split
            misses.append((cand, " ".join(str(err).split())))
    raise DataSourceError(missing_message(spec, misses))


def missing_message(spec: str, misses: list[tuple[HubSpec, str]]) -> str:
    """One line: the id, what the cache had, and the command that fetches it (per reading of the id)."""
    known = [c for c, why in misses if why]  # the cache holds this id, not the config/split asked for
    detail = "; ".join(f"{c.repo}: {why}" for c, why in misses if why)
    commands = " or ".join(fetch_command(c) for c in (known or [c for c, _ in misses]))
    return (f"dataset {spec!r} was not found in the local datasets cache {cache_dir()} (offline: nothing is downloaded)"
            + (f" [{detail}]" if detail else "")
            + f"; fetch it on a machine with network: {commands}; then set HF_HOME=DIR here")


ROWS_PER_BATCH = 64
"""Rows `iter_rows` takes from the data library at a time by default (Arrow batches): memory flat in the rows,
a batch of short rows (instructions, task items) small; a reader of long rows (books) takes 1."""


def iter_rows(source: str | Path, split: str | None = None, rows_at_once: int = ROWS_PER_BATCH) -> Iterator[dict[str, Any]]:
    """Rows of one split, one at a time (files streamed, Arrow memory-mapped): memory flat in the rows."""
    data = open_source(source, split, streaming=True)
    if is_dataset_dict(data) and len(data) == 1:
        data = next(iter(data.values()))
    if is_dataset_dict(data):  # and no split named
        how = f"its split folder {Path(source) / 'SPLIT'}" if Path(source).exists() else f"`{source}:SPLIT`"
        raise DataSourceError(f"{source}: several splits {sorted(data)}; name one: {how}")
    if rows_at_once == 1:  # rows of their own size (books): one in memory at a time
        yield from data
        return
    for batch in data.iter(batch_size=rows_at_once):  # 7x faster than row by row (192,400 rows: 0.7 s, 4.7 s)
        yield from (dict(zip(batch, values)) for values in zip(*batch.values()))
