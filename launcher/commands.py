"""The command table: the package commands `evalm` dispatches and `evalm run`'s stages are built from.

`launcher.cli` (the `evalm` command) is this table plus `run`; every stage of `evalm run`
(`launcher.stages`) writes its argv with `argv()` against the same table and runs it through
`dispatch()`, so each stage is exactly a command a user can run alone. Each entry imports its
package only when called, so `evalm --help` is fast and no package below the launcher ever imports
upward.
"""

from __future__ import annotations

from collections.abc import Sequence

from evalm.config_toolkit import lazy
from evalm.config_toolkit.dispatch import Run


def _data(argv: Sequence[str]) -> int:
    if argv[:1] == ["samples"]:  # composes icl_eval's and train's formats: a top-floor command
        from evalm.launcher.samples import main as samples

        return samples(argv[1:])
    from evalm.data_pipeline.cli import main

    return main(argv)


COMMANDS: dict[str, tuple[str, Run]] = {
    "data": ("corpus preparation jobs: filter, dedup, blend, samples", _data),
    "train": ("tokenizer, pretrain (FSDP2, resumable), msit-data and msit (many-shot instruction tuning)",
              lazy("evalm.train.cli:main")),
    "eval": ("many-shot ICL (incremental | concat | structured | saicl | ensemble), perplexity vs length, recall",
             lazy("evalm.icl_eval.cli:main")),
    "export": ("write a checkpoint as safetensors + config.json", lazy("evalm.train.export:main")),
    "convert": ("a Llama-family transformers model with EVA attention (uptrain it: evalm train uptrain)",
                lazy("evalm.train.convert:main")),
    "study": ("earlier spellings: study prepare|widen = convert --prepare|--widen, trainables|rebuild = train uptrain "
              "--export-trainables|--rebuild, digest = export --digest, summary = run --summary",
              lazy("evalm.launcher.study_aliases:main")),
}
"""Command -> (one-line help, function of the remaining arguments): `config_toolkit.Dispatcher`'s table."""


def argv(command: str, *args: object) -> list[str]:
    """`evalm COMMAND ARGS...` as the argv list a stage runs (paths and numbers as strings)."""
    if command not in COMMANDS:
        raise KeyError(f"no command {command!r} in the table; valid: {', '.join(COMMANDS)}")
    return [command, *map(str, args)]


def dispatch(argv: Sequence[str]) -> int:
    """Run `evalm ARGV` in this process; returns its exit status."""
    return int(COMMANDS[argv[0]][1](list(argv[1:])) or 0)
