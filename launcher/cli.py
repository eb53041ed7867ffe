"""`evalm`: the one command. Subcommands are one dict of functions (litgpt's PARSER_DATA).

Each function imports its package only when called, so `evalm --help` is fast and no package
below the launcher ever imports upward (ARCHITECTURE.md, "Floors").
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

# Nothing may reach a hub at run time; without these a hub lookup hangs ~23 s before failing.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def _run(argv: Sequence[str]) -> int:
    from launcher.run import main

    return main(argv)


def _data(argv: Sequence[str]) -> int:
    if argv[:1] == ["samples"]:  # composes icl_eval's and train's formats: a top-floor command
        from launcher.samples import main as samples

        return samples(argv[1:])
    from data_pipeline.cli import main

    return main(argv)


def _train(argv: Sequence[str]) -> int:
    from train.cli import main

    return main(argv)


def _eval(argv: Sequence[str]) -> int:
    from icl_eval.cli import main

    return main(argv)


def _export(argv: Sequence[str]) -> int:
    from train.export import main

    return main(argv)


COMMANDS: dict[str, tuple[Callable[[Sequence[str]], int], str]] = {
    "run": (_run, "every stage in order on a config (default: the tiny embedded one)"),
    "data": (_data, "corpus preparation jobs: filter, dedup, blend, samples"),
    "train": (_train, "tokenizer, pretrain (FSDP2, resumable), msit (many-shot instruction tuning)"),
    "eval": (_eval, "many-shot ICL (incremental | concat | structured | saicl | ensemble) and perplexity vs length"),
    "export": (_export, "write a checkpoint as safetensors + config.json"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items())
    return (
        "usage: evalm [--version] [--debug] COMMAND [ARGS...]\n\n"
        "EVALM end to end: raw corpus -> long-range LM -> many-shot evaluation.\n\n"
        f"commands:\n{rows}\n\n"
        "`evalm COMMAND --help` explains each one. `evalm run` with no argument builds a tiny\n"
        "EVALM from shipped sample data on the CPU in minutes.\n\n"
        "global options (before COMMAND):\n"
        "  --version  print the package version and exit\n"
        "  --debug    show the traceback of an error instead of its one-line message (default: off)\n"
    )


def version() -> str:
    """The installed package's version (pyproject.toml)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("evalm")
    except PackageNotFoundError:
        return "unknown (not installed; pip install -e .)"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    while argv and argv[0] in ("--debug", "--version"):
        if argv.pop(0) == "--version":
            print(f"evalm {version()}")
            return 0
        os.environ["EVALM_DEBUG"] = "1"  # read by every command (and the stages `evalm run` starts)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"evalm: unknown command {name!r}; valid: {', '.join(COMMANDS)}\n", file=sys.stderr)
        print(usage(), file=sys.stderr)
        return 2
    return int(COMMANDS[name][0](rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
