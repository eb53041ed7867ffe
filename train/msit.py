"""`evalm train msit`: many-shot instruction tuning from a pretrained checkpoint (EVALM §3.2, App. B).

    python -m evalm.train.msit --config configs/msit-tiny.toml --out runs/msit-tiny \
        --set checkpoint.init_from=runs/pretrain-tiny
    torchrun --nproc_per_node=8 -m evalm.train.msit --config configs/msit-plus.toml --out runs/msit-plus

Instruction examples are templated, held-out clusters removed, and whole examples packed into
lines of 8192 (MSIT) or 16384 (MSIT+) tokens by `train.packing`; the loop, checkpoints and resume
are pretraining's (`train.trainer`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from evalm.config_toolkit import ConfigError
from evalm.config_toolkit.environment import command_environment
from evalm.text.tokenizer import load_tokenizer
from evalm.train.command import TrainCommand, run_command
from evalm.train.config import MsitDataConfig
from evalm.train.packing import MixedLines, PackedLines, build_lines
from evalm.train.shards import PretrainLines, TokenShards
from evalm.train.structure import SaiclMask
from evalm.train.parallelize import Runtime

DEFAULT_CONFIG = "configs/msit-tiny.toml"


def make_source(config: MsitDataConfig, model_vocab: int):
    """Packed MSIT lines; every rank packs the same lines (deterministic), rank 0 reports the counts."""

    def source(runtime: Runtime) -> PackedLines | MixedLines:
        tokenizer = load_tokenizer(config.tokenizer)
        if tokenizer.vocab_size > model_vocab:
            raise ConfigError(f"{config.tokenizer}: {tokenizer.vocab_size} ids but model.vocab_size is "
                              f"{model_vocab}; raise model.vocab_size")
        lines, stats = build_lines(config, tokenizer)
        if config.structure == "saicl":  # the trainer feeds these lines under the SAICL mask
            lines.structure = SaiclMask(tokenizer.eos_id, config.saicl_queries)
        if config.pretrain_fraction:
            pretraining = PretrainLines(TokenShards(config.pretrain_shards), config.seq_len)
            lines = MixedLines(lines, pretraining, config.pretrain_fraction)
            stats["pretraining_lines_mixed"] = len(lines) - stats["lines"]
        if runtime.is_main:
            print(f"msit data: {stats['examples']} examples of {len(stats['tasks'])} tasks in {stats['lines']} "
                  f"lines of {config.seq_len}; held out {stats['removed_held_out']} examples of "
                  f"{stats['held_out_tasks']}; dropped oversize {stats['dropped_oversize']}, "
                  f"truncated {stats['truncated']}; pretraining lines mixed in "
                  f"{stats.get('pretraining_lines_mixed', 0)}", flush=True)
        return lines

    return source


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(argv, TrainCommand("msit", __doc__, DEFAULT_CONFIG, make_source, data_cls=MsitDataConfig))


if __name__ == "__main__":
    command_environment()
    sys.exit(main())
