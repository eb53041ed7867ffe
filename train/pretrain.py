"""`evalm train pretrain`: causal-LM pretraining on token shards (EVALM §3.2, Appendix A.2).

    python -m evalm.train.pretrain --config configs/pretrain-tiny.toml --out runs/tiny
    torchrun --nproc_per_node=8 -m evalm.train.pretrain --config configs/evalm-350m.toml --out runs/350m
    python -m evalm.train.pretrain --config ... --out runs/350m --resume auto    # continue a run

The same entry point serves one process and torchrun (nanochat `compute_init`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from evalm.config_toolkit import ConfigError
from evalm.config_toolkit.environment import command_environment
from evalm.train.command import TrainCommand, run_command
from evalm.train.parallelize import Runtime
from evalm.train.shards import PretrainLines, TokenShards

DEFAULT_CONFIG = "configs/pretrain-tiny.toml"


def make_source(config, model_vocab: int):
    """Fixed seq_len + 1 lines over the token shards named by `[data] shards`."""

    def source(runtime: Runtime) -> PretrainLines:
        shards = TokenShards(config.shards)
        if shards.vocab_size > model_vocab:
            raise ConfigError(f"{config.shards}: the tokenizer has {shards.vocab_size} ids but "
                              f"model.vocab_size is {model_vocab}; raise model.vocab_size")
        return PretrainLines(shards, config.seq_len)

    return source


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(argv, TrainCommand("pretrain", __doc__, DEFAULT_CONFIG, make_source))


if __name__ == "__main__":
    command_environment()
    sys.exit(main())
