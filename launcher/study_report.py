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
the table.

A goal is met when all its checks hold, missed when one fails, and unmeasured (said, never guessed) when a
figure it names is not there. A figure is `TABLE ROW COLUMNS` (TABLE: a table's `name`, by default its
reader), the largest of the cells named; COLUMNS is comma-separated, each a column's name (`4096-8192`, a
bucket; `niah_single/16384/0`, task/length/depth; `1024` or `1024/test_majority`, shots and a baseline) or
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


def _fmt(value, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


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


def ppl_table(found: dict[str, dict]) -> tuple[str, dict[str, dict[str, float]]]:
    """Token perplexity by position (the cache's protocol) per row, the references as rows below."""
    def buckets(entries) -> dict[str, float]:
        return {f"{b['bucket'][0]}-{b['bucket'][1]}": b["token_ppl"] for b in entries}

    cells = {m: buckets(r["protocols"]["cached"]["buckets"]) for m, r in found.items()}
    for name, ref in next(iter(found.values())).get("references", {}).items():  # the same book and buckets
        cells[f"({name})"] = buckets(ref["buckets"])
    columns = sorted({c for row in cells.values() for c in row}, key=lambda c: int(c.split("-")[0]))
    head = [f"[{int(a):,}, {int(b):,})" for a, b in (c.split("-") for c in columns)]
    lines = ["| model | " + " | ".join(head) + " |", "|---" * (len(columns) + 1) + "|"]
    lines += [f"| {m} | " + " | ".join(_fmt(row.get(c)) for c in columns) + " |" for m, row in cells.items()]
    return "\n".join(lines) + "\n", cells


def recall_table(found: dict[str, dict]) -> tuple[str, dict[str, dict[str, float]]]:
    """Exact-match recall per row, task and length, by needle depth, with chance."""
    rows = {m: r["cells"] for m, r in found.items()}
    depths = sorted({c["depth"] for cs in rows.values() for c in cs})
    lines = ["| model | task | length | " + " | ".join(f"depth {d}" for d in depths) + " | chance |",
             "|---" * (len(depths) + 4) + "|"]
    for model, cs in rows.items():
        for task, length in sorted({(c["task"], c["length"]) for c in cs}):
            row = {c["depth"]: c for c in cs if (c["task"], c["length"]) == (task, length)}
            shown = [f"{row[d]['accuracy']:.2f} [{row[d]['ci95'][0]:.2f}, {row[d]['ci95'][1]:.2f}]" if d in row else "–"
                     for d in depths]
            lines.append(f"| {model} | {task} | {length:,} | " + " | ".join(shown)
                         + f" | {next(iter(row.values()))['chance']:.2g} |")
    cells = {m: {f"{c['task']}/{c['length']}/{c['depth']}": c["accuracy"] for c in cs} for m, cs in rows.items()}
    return "\n".join(lines) + "\n", cells


def icl_table(found: dict[str, dict]) -> tuple[str, dict[str, dict[str, float]]]:
    """ICL accuracy by shots per row (its one method), with its seed-aware interval and the label baselines."""
    lines = ["| model | shots | accuracy [95% CI] | chance | test majority | in-context majority |", "|---" * 6 + "|"]
    cells: dict[str, dict[str, float]] = {}
    for model, results in found.items():
        by_shots = next(iter(results["summary"]["test"].values()))
        cells[model] = {}
        for shots, cell in sorted(by_shots.items(), key=lambda kv: int(kv[0])):
            base = {k: v["mean"] for k, v in cell["baselines"].items()}
            cells[model] |= {shots: cell["accuracy_mean"], **{f"{shots}/{k}": v for k, v in base.items()}}
            ci = cell["accuracy_ci95"]
            lines.append(f"| {model} | {shots} | {cell['accuracy_mean']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] | "
                         f"{base['chance']:.3f} | {base['test_majority']:.3f} | {base['in_context_majority']:.3f} |")
    return "\n".join(lines) + "\n", cells


def probe_table(found: dict[str, dict]) -> tuple[str, dict[str, dict[str, float]]]:
    """Per layer, at the farthest query bucket: the original attention's mass outside the window, EVA's error
    with its summaries and without them, per row."""
    first = next(iter(found.values()))
    a, b = first["buckets"][-1]
    lines = [f"Queries at [{a:,}, {b:,}); error = mean squared error of the attention output per head (the transfer "
             "loss), `off` = the summaries off.", "",
             "| layer | " + " | ".join(f"{s}: outside | {s}: error | {s}: error off" for s in found) + " |",
             "|---" * (3 * len(found) + 1) + "|"]
    for i in range(len(first["layers"])):
        shown = [f"{p['layers'][i]['outside'][-1]:.3f} | {p['layers'][i]['error'][-1]:.3g} | "
                 f"{p['layers'][i]['error_no_remote'][-1]:.3g}" for p in found.values()]
        lines.append(f"| {i} | " + " | ".join(shown) + " |")
    cells = {s: {f"{i}/{k}": layer[k][-1] for i, layer in enumerate(p["layers"]) for k in ("outside", "error",
                                                                                           "error_no_remote")}
             for s, p in found.items()}
    return "\n".join(lines) + "\n", cells


TABLES = {"ppl": ppl_table, "recall": recall_table, "icl": icl_table, "probe": probe_table}


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
            text, cells[table.name or table.reader] = TABLES[table.reader](found) if found else \
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
