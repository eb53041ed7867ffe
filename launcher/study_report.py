"""A study's report, ROOT/summary.md: the tables and goals its own file declares, read from its folder.

    evalm run --config configs/study-summaries.toml --summary     # the report alone, nothing run
    evalm run --config configs/study-summaries.toml               # every step not done, then the report

A study file says what its report holds in `[summary]` (checked like every section: an unknown key is one
line naming it); `{root}` and the study's `{vars}` are replaced in it as in its steps:

    [summary]
    title = "EVA's summaries on a converted model"
    files = ["lora/trainables.safetensors"]                 # each with its size and SHA-256
    [[summary.table]]
    title = "Perplexity by position"
    reader = "ppl"                                          # the results of `evalm eval ppl`
    rows = ["ppl/original", "ppl/lora", "ppl/lora-off"]     # folders under ROOT; a row is named by its last part
    [[summary.goal]]
    about = "with summaries below without at [L/2, L)"
    checks = [{ figure = "ppl lora -{seq_len}", op = "<", than = "ppl lora-off -{seq_len}" }]

Each table's `reader` is the command whose results file its rows are: `ppl` (eval ppl: token perplexity by
position bucket, the uniform and unigram references as rows below), `recall` (eval recall: exact match by
needle depth, with chance), `icl` (eval icl: accuracy by shots with its interval and the three label
baselines), `probe` (train probe: per layer, the attention mass outside the window and EVA's error with
and without its summaries). Every figure is read from those files: nothing is loaded, nothing computed but
the table; the tables are icl_eval/tables.py's (`READERS`), the one writer of study tables.

A goal is met when all its checks hold, missed when one fails, and unmeasured (said, never guessed) when a
figure it names is not there. A figure is `TABLE ROW COLUMNS` (TABLE: a table's `name`, by default its
reader), the largest of the cells named; COLUMNS is comma-separated, each a column's name (`4096-8192`, a
bucket; `niah_single/16384/0`, task/length/depth; `1024`, `1024/test_majority` or `1024/seconds_per_item`,
shots and a baseline or the time per test item) or
a glob of them (`niah_single/*/0`), and for buckets `A-` (every bucket from A on) or `-B` (the bucket
ending at B). `than` is a figure or a number; `times` scales it (`<= 1.05 x` the original).
"""

from __future__ import annotations

import fnmatch
import operator
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import Any, Literal

from pydantic.dataclasses import dataclass

from evalm.config_toolkit import FROZEN, ConfigError, MissingInput, build
from evalm.icl_eval.tables import READERS
from evalm.storage import DamagedFile, read_json, sha256, write_atomic

Reader = Literal["ppl", "recall", "icl", "probe"]
RESULTS = {"ppl": "results.json", "recall": "results.json", "icl": "results.json", "probe": "probe.json"}
"""A row folder's results file, by reader."""
OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


@dataclass(config=FROZEN, frozen=True)
class Check:
    """One comparison of a goal: `figure op times x than`."""

    figure: str
    op: Literal["<", "<=", ">", ">="]
    than: str | float
    times: float = 1.0


@dataclass(config=FROZEN, frozen=True)
class Goal:
    """`[[summary.goal]]`: what the study hopes for, as checks that must all hold."""

    about: str
    checks: list[Check]


@dataclass(config=FROZEN, frozen=True)
class Table:
    """`[[summary.table]]`: rows of one command's results."""

    reader: Reader
    rows: list[str]
    title: str = ""
    name: str = ""
    """What a goal's figure calls the table (default: its reader)."""


@dataclass(config=FROZEN, frozen=True)
class Summary:
    """`[summary]` of a study file."""

    title: str = ""
    files: list[str] = field(default_factory=list)
    table: list[Table] = field(default_factory=list)
    goal: list[Goal] = field(default_factory=list)


def declared(raw: Any, substitute: Callable[[str], str], where: str) -> Summary | None:
    """The `[summary]` section of a study file (None without one), `substitute` applied to every string in it."""
    if raw is None:
        return None

    def replaced(value: Any) -> Any:
        if isinstance(value, str):
            return substitute(value)
        if isinstance(value, list):
            return [replaced(v) for v in value]
        return {k: replaced(v) for k, v in value.items()} if isinstance(value, dict) else value

    if not isinstance(raw, dict):
        raise ConfigError(f"{where} [summary]: must be a table")
    return build(Summary, replaced(raw), where=f"{where} [summary]")


def _rows(root: Path, table: Table) -> dict[str, dict]:
    """Each row's results (by its name), for the rows whose file is there."""
    found = {}
    for row in table.rows:
        path = root / row / RESULTS[table.reader]
        if path.is_file():
            data = read_json(path, f"a results file of `{table.reader}`")
            if not isinstance(data, dict):
                raise DamagedFile(f"{path}: not a results object; rerun the step that writes it")
            found[Path(row).name] = data
    return found


def _matches(column: str, wanted: str) -> bool:
    """`wanted` names `column`: equal, a glob of it, or for a bucket `A-B`, `A-` (from A on) or `-B` (ending at B)."""
    bucket = column.split("-")
    if len(bucket) == 2 and all(p.isdigit() for p in bucket) and wanted.count("-") == 1:
        lo, hi = wanted.split("-")
        if not (lo and hi) and (lo or hi).isdigit():
            return int(bucket[0]) >= int(lo) if lo else int(bucket[1]) == int(hi)
    return fnmatch.fnmatchcase(column, wanted)


def figure(text: str, cells: dict[str, dict[str, dict[str, float]]]) -> float | None:
    """The figure `TABLE ROW COLUMNS` (the largest cell named), None when none of its cells was measured."""
    parts = text.split()
    if len(parts) != 3:
        raise ConfigError(f"[summary] figure {text!r}: write TABLE ROW COLUMNS, e.g. 'ppl lora 4096-8192'")
    table, row, columns = parts
    found = [v for c, v in cells.get(table, {}).get(row, {}).items() if any(_matches(c, w) for w in columns.split(","))]
    return max(found) if found else None


def goal_line(goal: Goal, cells: dict[str, dict[str, dict[str, float]]]) -> str:
    """`- ABOUT: met|missed|unmeasured (the figures it was decided on)`."""
    shown, missing, held = [], [], True
    for check in goal.checks:
        left = figure(check.figure, cells)
        right = check.than if isinstance(check.than, float) else figure(check.than, cells)
        if left is None or right is None:
            missing += [f for f, v in ((check.figure, left), (str(check.than), right)) if v is None]
            continue
        held = held and OPS[check.op](left, check.times * right)
        scale = f"{check.times:g} x " if check.times != 1 else ""
        shown.append(f"{check.figure} = {left:.3g} {check.op} {scale}{check.than} = {right:.3g}"
                     if not isinstance(check.than, float) else f"{check.figure} = {left:.3g} {check.op} {scale}{right:g}")
    if missing:
        return f"- {goal.about}: unmeasured (no {'; '.join(dict.fromkeys(missing))})"
    return f"- {goal.about}: {'met' if held else 'missed'} ({'; '.join(shown)})"


def file_line(path: Path) -> str:
    if not path.is_file():
        return f"- {path}: not written yet"
    return f"- {path} ({path.stat().st_size / 2**20:.1f} MiB), sha256 {sha256(path)}"


def report_text(root: Path, summary: Summary, name: str) -> str:
    """The whole summary.md text of the study folder `root`."""
    if not root.is_dir():
        raise MissingInput(f"{root}: no such folder; run the study first (evalm run --config FILE)")
    sections, cells = [], {}
    for table in summary.table:
        found = _rows(root, table)
        try:
            text, cells[table.name or table.reader] = READERS[table.reader](found) if found else \
                (f"no {table.reader} results yet\n", {})
        except (KeyError, TypeError, IndexError, StopIteration, AttributeError, ValueError) as err:
            raise DamagedFile(f"{root}: a results file of {', '.join(found)} ({table.reader}) lacks what its command "
                              f"writes ({type(err).__name__}: {err}); rerun that step") from None
        sections += [f"## {table.title or table.reader}", "", text]
    lines = [f"# Study {name}{': ' + summary.title if summary.title else ''} ({root})", ""]
    if summary.goal:
        lines += ["## Goals", "", *(goal_line(g, cells) for g in summary.goal), ""]
    if summary.files:
        lines += ["## Files", "", *(file_line(root / f) for f in summary.files), ""]
    return "\n".join([*lines, *sections])


def write_report(root: Path, summary: Summary, name: str) -> Path:
    """ROOT/summary.md, written whole or not at all; returns its path."""
    return write_atomic(root / "summary.md", report_text(root, summary, name))
