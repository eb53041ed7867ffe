"""Everything a stage needs around its pure steps: folders, tasks, executors, markers, manifest.

A stage is a chain of datatrove executors (datatrove's
`_run_for_rank`): each step runs as N tasks and each task writes its outputs, then its stats
(ours in `stats/`, datatrove's in `logs/<step>/stats/`), then datatrove's completion marker
`logs/<step>/completions/<rank>`. A relaunch skips completed tasks and reruns the others from
scratch, overwriting their partial files; outputs are deterministic, so the result is byte for
byte that of an uninterrupted run. The last step of every stage writes `manifest.json`.

The stage folder is a `storage.RunFolder`: `config.json` records the stage, inputs (with their
SHA-256), task count and resolved config on the first launch; a relaunch that changes anything but a
run-only setting (RUN_ONLY) is refused with the differing keys (a mixed folder would be silently
wrong), and `--overwrite` starts over a folder this stage made (never an input, nor a folder another
command made). An output that overlaps an input is refused before anything is written.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import re
import sys
import threading
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.writers.jsonl import JsonlWriter

from evalm.config_toolkit import UserError
from evalm.storage import RunFolder, write_atomic
from evalm.data_pipeline.document import Document
from evalm.data_pipeline.reader import PileReader, is_data_file


class StageError(UserError, RuntimeError):
    """A stage that cannot run as asked; the message says why and what to do."""


# ---------------------------------------------------------------- inputs


def resolve_inputs(paths: Sequence[str | Path]) -> tuple[Path, list[str]]:
    """(common root, sorted data files relative to it). A stage output folder means its documents/."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw).resolve()
        if path.is_dir() and (path / "manifest.json").is_file():
            if not (path / "documents").is_dir():
                raise StageError(f"{path} is a finished stage with no documents/ (everything was dropped? see its manifest.json)")
            path = path / "documents"
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and is_data_file(p.name))
            if not found:
                raise StageError(f"{path}: no .jsonl, .jsonl.zst, .jsonl.gz or .parquet files inside")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise StageError(f"{raw}: input not found")
    files = sorted(set(files))
    root = Path(os.path.commonpath([str(f.parent) for f in files]))
    return root, [str(f.relative_to(root)) for f in files]


def task_files(files: Sequence[str], rank: int, tasks: int) -> list[str]:
    """datatrove's sharding of a paths file: file i belongs to task i mod tasks."""
    return [f for i, f in enumerate(files) if i % tasks == rank]


def reader(output: Path) -> PileReader:
    """A reader over the inputs recorded in output/config.json (datatrove shards them)."""
    settings = json.loads((output / "config.json").read_text())
    return PileReader(settings["input_root"], paths_file=str(output / "inputs.txt"))


def read_all(output: Path, errors: list[dict] | None = None) -> Iterator[tuple[int, Document]]:
    """Every input document in task order (task 0's files, then task 1's...), numbered densely.

    The global steps (graph, blend plan) see documents in the same order as the per-task
    fingerprint files, so a dense id means the same document everywhere. Bad records are
    appended to `errors` when given.
    """
    settings = json.loads((output / "config.json").read_text())
    n = 0
    for rank in range(settings["tasks"]):
        source = reader(output)
        for doc in source.run(None, rank, settings["tasks"]):
            yield n, doc
            n += 1
        if errors is not None:
            errors.extend(source.errors)


# ---------------------------------------------------------------- outputs


def writer(output: Path, kind: str, compression: str) -> JsonlWriter:
    """datatrove's jsonl writer for `output/kind/<rank>.jsonl[.zst|.gz]` in our record format."""
    suffix = {"zstd": ".zst", "gzip": ".gz", "none": ""}[compression]
    return JsonlWriter(
        str(output / kind),
        output_filename="${rank}.jsonl" + suffix,
        compression=None if compression == "none" else compression,
        adapter=lambda _self, doc: doc.to_record(),
    )


def write_json(path: Path, data: Any) -> None:
    """Sorted, indented JSON (numpy values as numbers) written whole or not at all (`storage.write_atomic`)."""
    write_atomic(path, orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY))


def write_errors(output: Path, rank: int, errors: list[dict], records: int, max_fraction: float) -> None:
    """errors/<rank>.jsonl (always written, possibly empty); fail past the allowed fraction."""
    path = output / "errors" / f"{rank:05d}.jsonl"
    write_atomic(path, b"".join(orjson.dumps(e, option=orjson.OPT_APPEND_NEWLINE) for e in errors))
    if records and len(errors) / records > max_fraction:
        raise StageError(
            f"task {rank}: {len(errors)} bad records out of {records} exceed max_error_fraction="
            f"{max_fraction}; see {path} (file, line, kind of each). Fix or remove those inputs, "
            "or raise max_error_fraction in the config."
        )


# ---------------------------------------------------------------- folder contract


# Settings a relaunch may change: they alter no output byte, only when a task gives up or which
# index finds the (identical) candidate pairs. Following "raise max_error_fraction" or "leave
# --redis-url out" in the same folder must work.
RUN_ONLY = ("config.max_error_fraction", "index.kind", "index.redis_url", "index.namespace")
FLAGS = {"tasks": "--tasks", "input_root": "--input", "inputs": "--input", "config": "--config",
         "input_sha256": "--input (the same file contents)",
         "wordlists": "--config", "budgets": "--budgets"}


def record_settings(folder: RunFolder, settings: dict[str, Any], files: Sequence[str]) -> bool:
    """Write config.json + inputs.txt on first launch; refuse a relaunch whose settings differ
    (naming only the differing keys; `RunFolder.record`). Returns True when the folder starts fresh
    (nothing of an earlier launch is reused)."""
    def advice(changed: list[str]) -> str:
        flags = ", ".join(sorted({FLAGS.get(k.split(".")[0], k) for k in changed}))
        return (f"To continue it, relaunch with the recorded {flags} (all in its config.json); to start over, add "
                "--overwrite (deletes the folder)")

    if not (folder.path / "config.json").is_file():  # inputs.txt first: a recorded config.json implies it
        write_atomic(folder.path / "inputs.txt", "".join(f"{f}\n" for f in files))
    # input_sha256: folders made before inputs were hashed lack it
    return folder.record("config.json", settings, ignore=RUN_ONLY, added=("input_sha256",), advice=advice)


# ---------------------------------------------------------------- executors


def _local(pipeline, tasks, logging_dir, depends, options):
    from datatrove.executor import LocalPipelineExecutor

    workers = int(options.pop("workers", 1))
    # forkserver (datatrove's default) starts one server per process, which keeps the stderr of the
    # moment it started: every later stage's worker lines would go to the first stage's log or the
    # terminal (launcher/console.py). Spawned workers take the file descriptors of their own stage.
    options.setdefault("start_method", "spawn")
    return LocalPipelineExecutor(
        pipeline, tasks=tasks, workers=min(workers, tasks), logging_dir=logging_dir, depends=depends, **options
    )


def _slurm(pipeline, tasks, logging_dir, depends, options):
    from datatrove.executor import SlurmPipelineExecutor

    options.pop("workers", None)
    options.setdefault("time", "24:00:00")
    if "partition" not in options:
        raise StageError("--executor slurm needs --executor-option partition=NAME (and time=HH:MM:SS)")
    return SlurmPipelineExecutor(pipeline, tasks=tasks, logging_dir=logging_dir, depends=depends, **options)


def _ray(pipeline, tasks, logging_dir, depends, options):
    try:
        from datatrove.executor.ray import RayPipelineExecutor
        import ray
    except ImportError:
        raise StageError("--executor ray needs `pip install 'evalm[ray]'` on every node") from None
    address = options.pop("address", None)  # else RAY_ADDRESS, else a one-machine Ray started here
    if not ray.is_initialized():
        try:
            ray.init(address=address, log_to_driver=False)
        except ConnectionError as err:
            raise StageError(f"--executor ray: cannot reach the Ray cluster at {address or 'RAY_ADDRESS'}: {err}; "
                             "start one with `ray start --head` and pass --executor-option address=HOST:PORT") from None
    workers = int(options.pop("workers", -1))
    return RayPipelineExecutor(pipeline, tasks=tasks, workers=workers, logging_dir=logging_dir, depends=depends, **options)


EXECUTORS: dict[str, Callable] = {"local": _local, "slurm": _slurm, "ray": _ray}
BLOCKING = ("local", "ray")  # executors whose run() returns when the tasks have finished


def parse_options(items: Sequence[str]) -> dict[str, Any]:
    """`KEY=VALUE` executor options; values read as TOML (numbers, booleans), else strings."""
    out = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep:
            raise StageError(f"--executor-option {item!r}: expected KEY=VALUE, e.g. partition=cpu")
        try:
            out[name.strip()] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            out[name.strip()] = raw
    return out


SET_BY_US = {"pipeline", "tasks", "logging_dir", "depends", "self"}
"""Executor arguments every stage sets itself: not `--executor-option`s."""


def _executor_class(executor: str):
    """datatrove's executor class of `--executor` (None for Ray without the extra: its builder says what to install)."""
    if executor == "local":
        from datatrove.executor import LocalPipelineExecutor

        return LocalPipelineExecutor
    if executor == "slurm":
        from datatrove.executor import SlurmPipelineExecutor

        return SlurmPipelineExecutor
    try:
        from datatrove.executor.ray import RayPipelineExecutor
    except ImportError:
        return None
    return RayPipelineExecutor


def check_options(executor: str, options: dict[str, Any]) -> None:
    """Refuse an `--executor-option` the executor does not take (datatrove would stop with a TypeError), naming
    the ones it does; `address` is ours on Ray (the cluster to join)."""
    if executor not in EXECUTORS:
        raise StageError(f"unknown executor {executor!r}; valid: {sorted(EXECUTORS)}")
    cls = _executor_class(executor)
    if cls is None:
        return
    valid = set(inspect.signature(cls.__init__).parameters) - SET_BY_US | ({"address"} if executor == "ray" else set())
    unknown = sorted(set(options) - valid)
    if unknown:
        raise StageError(f"--executor-option {', '.join(unknown)}: not an option of the {executor} executor; "
                         f"valid: {', '.join(sorted(valid))}")


@dataclass(frozen=True)
class Step:
    name: str
    tasks: int
    step: PipelineStep


def run_steps(output: Path, steps: Sequence[Step], executor: str, options: dict[str, Any]) -> None:
    """Chain the steps (each depends on the previous) and launch the last; datatrove runs the
    chain, skipping completed tasks. Locally and on Ray everything has finished on return (the
    Ray driver waits for its tasks); on Slurm the jobs are submitted."""
    if executor not in EXECUTORS:
        raise StageError(f"unknown executor {executor!r}; valid: {sorted(EXECUTORS)}")
    previous = None
    for s in steps:
        previous = EXECUTORS[executor]([s.step], s.tasks, str(output / "logs" / s.name), previous, dict(options))
    with _console_without_tracebacks(output):
        previous.run()
    if executor in BLOCKING:
        for s in steps:
            done = len(list((output / "logs" / s.name / "completions").glob("*")))
            if done < s.tasks:
                raise StageError(
                    f"step {s.name!r}: {s.tasks - done} of {s.tasks} tasks did not complete; see "
                    f"{output / 'logs' / s.name / 'logs'}; relaunch the same command to run only those"
                )


@contextlib.contextmanager
def _console_without_tracebacks(output: Path) -> Iterator[None]:
    """datatrove logs a failing task's traceback (~120 lines) through loguru to stderr and to the
    task's log file, then re-raises; the command then prints the error in one line. So while the
    steps run, file descriptor 2 (this process's and every worker's it starts) goes through a pipe
    whose reader drops traceback blocks: the task log under output/logs keeps them. `--debug`
    leaves stderr alone."""
    from evalm.config_toolkit import debug

    if debug():
        yield
        return
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    console = os.dup(2)
    os.dup2(write_end, 2)
    os.close(write_end)
    drained = threading.Event()
    reader = threading.Thread(target=_drop_tracebacks, args=(read_end, console, output / "logs", drained), daemon=True)
    reader.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        # The last line through the pipe: the workers have exited, but datatrove's forkserver still holds
        # the write end (it inherited fd 2) until this process exits, so an end of file never comes (waiting
        # for it cost 10 s per data command, the timeout). The reader stays on, with its own copy of the
        # console, for whatever the forkserver's later workers write; it closes both at the end of file.
        os.write(2, END_OF_STEPS)
        os.dup2(console, 2)
        drained.wait(timeout=10)


END_OF_STEPS = b"\x00evalm: end of the steps\n"
"""Written last into the console pipe by this process: the reader sets `drained` when it gets there."""


LOG_RECORD = re.compile(rb"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ \| ")
"""The start of a loguru record as datatrove formats it: a traceback block ends at the next one."""


def _drop_tracebacks(read_end: int, console: int, logs: Path, drained: threading.Event) -> None:
    """Copy lines from the pipe to the console, replacing each traceback block by one line; set `drained`
    at END_OF_STEPS."""
    skipping = False
    with os.fdopen(read_end, "rb") as pipe, os.fdopen(console, "wb", buffering=0, closefd=True):
        for line in pipe:
            if line == END_OF_STEPS:
                drained.set()
                continue
            if skipping and not LOG_RECORD.match(line) and not line.startswith(b"evalm "):
                continue
            skipping = b"Traceback (most recent call last)" in line
            if skipping:
                line = f"  (traceback in the task log under {logs}; --debug shows it here)\n".encode()
            os.write(console, line)


def task_stats(output: Path, step: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((output / "stats" / step).glob("*.json"))]


def merge_counts(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Sum nested dicts of numbers (and element-wise lists: histograms)."""
    out: dict[str, Any] = {}
    for item in items:
        for k, v in item.items():
            if isinstance(v, dict):
                out[k] = merge_counts([out.get(k, {}), v])
            elif isinstance(v, list):
                prev = out.get(k, [0] * len(v))
                out[k] = [a + b for a, b in zip(prev, v)]
            elif isinstance(v, (int, float)):
                out[k] = out.get(k, 0) + v
    return out


class Manifest(PipelineStep):
    """The last step of every stage: manifest.json = settings + summed stats of every step."""

    name = "manifest"

    def __init__(self, output: str, summarize: Callable[[Path], dict[str, Any]]):
        super().__init__()
        self.output, self.summarize = output, summarize

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        output = Path(self.output)
        settings = json.loads((output / "config.json").read_text())
        write_json(output / "manifest.json", {**settings, **self.summarize(output)})
