"""`evalm study SUBCOMMAND`: earlier spellings, each forwarded to the command that owns its noun.

    evalm study prepare ARGS     = evalm convert --prepare ARGS              (--source is --hf-model)
    evalm study widen ARGS       = evalm convert --widen ARGS                (--model is --hf-model)
    evalm study trainables ARGS  = evalm train uptrain --export-trainables ARGS   (--run is --out)
    evalm study rebuild ARGS     = evalm train uptrain --rebuild ARGS
    evalm study digest FOLDER    = evalm export --digest FOLDER
    evalm study summary ARGS     = evalm run --config configs/study-summaries.toml --summary ARGS
                                   (--trained-length N is --set study.vars.seq_len=N)

Scripts call these spellings, so they keep working; nothing here does anything but rewrite the argv and
hand it to the command table of `evalm` itself, so an alias cannot drift from the command it names. (The
earlier flags are spellings the new commands accept themselves, but for the summary's one flag.)
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from evalm.config_toolkit import Dispatcher

ALIASES = {
    "prepare": ("= evalm convert --prepare: a GGUF or a Llama folder as a plain float32 folder",
                ["convert", "--prepare"]),
    "widen": ("= evalm convert --widen: a converted folder with a wider EVA window", ["convert", "--widen"]),
    "trainables": ("= evalm train uptrain --export-trainables: a run's trainable tensors, a small file",
                   ["train", "uptrain", "--export-trainables"]),
    "rebuild": ("= evalm train uptrain --rebuild: a run's OUT/hf from its trainable tensors",
                ["train", "uptrain", "--rebuild"]),
    "digest": ("= evalm export --digest: a folder's weights digest", ["export", "--digest"]),
    "summary": ("= evalm run --config configs/study-summaries.toml --summary: that study's report",
                ["run", "--config", "configs/study-summaries.toml", "--summary"]),
}
"""Old subcommand -> (help, the new command line it starts)."""
RENAMED = {"--trained-length": "study.vars.seq_len="}
"""An old flag whose value is now a study var: `--trained-length N` -> `--set=study.vars.seq_len=N`."""


def forwarded(name: str, argv: Sequence[str]) -> list[str]:
    """The new spelling of `evalm study NAME ARGV` (without `evalm`)."""
    args, out = list(argv), list(ALIASES[name][1])
    while args:
        flag, eq, value = args.pop(0).partition("=")
        out.append(f"--set={RENAMED[flag]}{value if eq else args.pop(0)}" if flag in RENAMED and (eq or args)
                   else flag + eq + value)
    return out


def forward(name: str, argv: Sequence[str]) -> int:
    """Run the new spelling through `evalm`'s command table."""
    from evalm.launcher.cli import COMMANDS

    new = forwarded(name, argv)
    return COMMANDS[new[0]][1](new[1:])


DISPATCHER = Dispatcher("evalm study", {name: (text, partial(forward, name)) for name, (text, _) in ALIASES.items()},
                        footer="Earlier spellings; each runs the command named on its line.")
usage, main = DISPATCHER.usage, DISPATCHER.main
