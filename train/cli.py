"""`evalm train SUBCOMMAND`: the subcommands are one dict of functions (litgpt `PARSER_DATA`).

Each imports its module only when called, so `evalm train --help` loads no torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence


def _tokenizer(argv: Sequence[str]) -> int:
    from train.tokenizer import main

    return main(argv)


def _pretrain(argv: Sequence[str]) -> int:
    from train.pretrain import main

    return main(argv)


def _msit(argv: Sequence[str]) -> int:
    from train.msit import main

    return main(argv)


def _msit_data(argv: Sequence[str]) -> int:
    from train.msit_data import main

    return main(argv)


def _metaicl(argv: Sequence[str]) -> int:
    from train.metaicl import main

    return main(argv)


COMMANDS: dict[str, tuple[Callable[[Sequence[str]], int], str]] = {
    "tokenizer": (_tokenizer, "train a byte-level BPE (or load one) and encode documents into token shards"),
    "pretrain": (_pretrain, "FSDP2 pretraining on token shards, resumable (--resume auto); same under torchrun"),
    "msit": (_msit, "many-shot instruction tuning: packed 8k (MSIT) / 16k (MSIT+) lines from a checkpoint"),
    "msit-data": (_msit_data, "MSIT rows: synthetic in-context episodes plus instruction rows, as jsonl"),
    "metaicl": (_metaicl, "MetaICL meta-training of a T5 with full, SAICL or FiD encoding (SAICL §3.3)"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items())
    return f"usage: evalm train COMMAND [ARGS...]\n\ncommands:\n{rows}\n\nSee docs/training.md.\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"evalm train: unknown command {name!r}; valid: {', '.join(COMMANDS)}\n", file=sys.stderr)
        return 2
    return int(COMMANDS[name][0](rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
