"""`evalm train SUBCOMMAND`: the subcommands are one dict (litgpt `PARSER_DATA`), dispatched by
`config_toolkit.Dispatcher`.

Each imports its module only when called, so `evalm train --help` loads no torch.
"""

from __future__ import annotations

import sys

from evalm.config_toolkit import Dispatcher, lazy

COMMANDS = {
    "tokenizer": ("train a byte-level BPE (or load one) and encode documents into token shards",
                  lazy("evalm.train.tokenizer:main")),
    "pretrain": ("FSDP2 pretraining on token shards, resumable (--resume auto); same under torchrun",
                 lazy("evalm.train.pretrain:main")),
    "msit": ("many-shot instruction tuning: packed 8k (MSIT) / 16k (MSIT+) lines from a checkpoint",
             lazy("evalm.train.msit:main")),
    "msit-data": ("MSIT rows: synthetic in-context episodes plus instruction rows, as jsonl",
                  lazy("evalm.train.msit_data:main")),
    "uptrain": ("train a converted model (evalm convert): attention transfer, LoRA or full; FSDP2, resumable",
                lazy("evalm.train.uptrain:main")),
    "recall": ("the recall study: one model (EVA, full, window or Mamba) trained on MQAR and passkey, resumable",
               lazy("evalm.train.recall:main")),
    "probe": ("what EVA's summaries carry per layer of a converted model: attention mass outside the window, error with and without them",
              lazy("evalm.train.attention_probe:main")),
    "memory": ("expected memory per GPU of a pretraining config under FSDP2 + activation checkpointing (nothing allocated)",
               lazy("evalm.footprint:main")),
    "metaicl": ("MetaICL meta-training of a T5 with full, SAICL or FiD encoding (SAICL §3.3)",
                lazy("evalm.train.metaicl:main")),
}
DISPATCHER = Dispatcher("evalm train", COMMANDS, footer="See docs/training.md.")
usage, main = DISPATCHER.usage, DISPATCHER.main


if __name__ == "__main__":
    sys.exit(main())
