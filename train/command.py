"""The command body shared by `evalm train pretrain`, `msit` and `uptrain` (`TrainCommand` says which).

Parse `--config FILE --out DIR [--set ...] [--resume ...]` into a `RunConfig`, run the trainer, and
report what the user can fix in one line (anything else as a bug, with its traceback kept in a log);
Ctrl-C keeps the last complete checkpoint and prints the command that resumes from it. The configs
themselves are `train.config`'s.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from evalm.config_toolkit import ConfigError, Parser, report, settable_keys, split_overrides
from evalm.train.config import DataConfig, RunConfig, load_run_config


@dataclass(frozen=True)
class TrainCommand:
    """One `evalm train` command whose run file is a `RunConfig`: its name, its doc (the first line is its
    --help's description), the run file it reads by default, what feeds the trainer, and how the run file
    is read when its sections are not pretraining's."""

    name: str
    """`pretrain`, `msit`, `uptrain`: `evalm train NAME`."""
    doc: str = ""
    """The command's module docstring."""
    default_config: str = ""
    """The run file without --config."""
    make_source: Callable | None = None
    """`make_source(data_config, vocab_size)`: the trainer's batches (None: the command only parses)."""
    data_cls: type = DataConfig
    """The `[data]` section's class."""
    sections: dict[str, type] | None = None
    """The run file's sections for --help (None: pretraining's)."""
    load: Callable = load_run_config
    """`load(path, overrides, data_cls)`: the run file read into a `RunConfig`."""
    options: Callable | None = None
    """`options(config)`: more keyword arguments of `trainer.RunOptions` (uptrain's model builder and step)."""

    @property
    def prog(self) -> str:
        return f"evalm train {self.name}"


def parse_run_args(argv: Sequence[str] | None, command: TrainCommand) -> tuple[RunConfig, Path, str]:
    """`--config FILE --out DIR [--set section.key=value ...] [--resume none|auto|PATH]`; the dotted
    `--section.key=value` is an alias of `--set` (the one override syntax of every `evalm` command).
    The command's `sections` (for --help) and `load` serve a run file of other sections."""
    from evalm.train.config import CheckpointConfig, ModelConfig, OptimConfig, TrainConfig

    prog, default_config = command.prog, command.default_config
    sections = command.sections or {"model": ModelConfig, "data": command.data_cls, "optim": OptimConfig,
                                    "train": TrainConfig, "checkpoint": CheckpointConfig}
    parser = Parser(prog=prog, description=command.doc.split("\n")[0], epilog=settable_keys(sections))
    parser.add_argument("--config", default=default_config, metavar="FILE",
                        help=f"run file with {', '.join(f'[{name}]' for name in sections)} (default: {default_config})")
    parser.add_argument("--out", default=None, metavar="DIR", help="run folder (default: runs/<config name>)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value, e.g. --set train.steps=10; repeatable (default: none)")
    parser.add_argument("--resume", default="none", metavar="none|auto|PATH",
                        help="none (refuses a folder with checkpoints), auto (latest complete checkpoint of --out, "
                             "else fresh), or a checkpoint path (default: none)")
    try:
        dotted, rest = split_overrides(list(argv if argv is not None else sys.argv[1:]))
    except ConfigError as err:
        parser.exit(2, f"{prog}: error: {err}\n")
    args = parser.parse_args(rest)
    try:
        config = command.load(args.config, [*dotted, *args.overrides], command.data_cls)
    except ConfigError as err:
        parser.exit(2, f"{prog}: error: {err}\n")
    out = Path(args.out) if args.out else Path("runs") / Path(args.config).stem
    return config, out, args.resume


def run_command(argv: Sequence[str] | None, command: TrainCommand) -> int:
    """The body of `evalm train pretrain|msit|uptrain`: parse, run the trainer, report errors without a
    traceback."""
    config, out, resume = parse_run_args(argv, command)
    from evalm.train import interrupt
    from evalm.train.trainer import RunOptions, run

    name, options = command.name, command.options
    again = " ".join(["evalm train", name, *_without_resume(argv), "--resume auto"])
    interrupt.set_hint(f"the last complete checkpoint under {out}/checkpoints is kept; resume with: {again}")
    try:
        config.check_memory()  # a shape or batch this machine cannot hold: one line, before anything is made
        run(config, out, command.make_source(config.data, config.model.vocab_size),
            RunOptions(name, resume, **(options(config) if options else {})))
    except Exception as err:  # noqa: BLE001 - also under torchrun, where no dispatcher is above: the one rule
        return report(command.prog, err)  # a user error in one line, else a bug with its log
    except BaseException as err:  # Ctrl-C: the last complete checkpoint stays; say how to continue from it
        if not _interrupted(err):
            raise
        print(f"{command.prog}: interrupted; the last complete checkpoint under {out}/checkpoints is kept; "
              f"resume with: {again}", file=sys.stderr)
        return 130
    return 0


def _interrupted(err: BaseException) -> bool:
    """Ctrl-C, also when it hit a checkpoint save and DCP wrapped it (CheckpointException, a BaseException)."""
    if isinstance(err, KeyboardInterrupt):
        return True
    failures = getattr(err, "failures", None)
    return isinstance(failures, dict) and any(isinstance(f[0], KeyboardInterrupt) for f in failures.values())


def _without_resume(argv: Sequence[str] | None) -> list[str]:
    """The command's own arguments minus any --resume, quoted for a shell."""
    import shlex

    args, skip = [], False
    for a in list(argv if argv is not None else sys.argv[1:]):
        if skip or a.startswith("--resume="):
            skip = False
            continue
        if a == "--resume":
            skip = True
            continue
        args.append(shlex.quote(a))
    return args
