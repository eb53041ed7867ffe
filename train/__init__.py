"""Training: tokenizer and token shards, FSDP2 pretraining with exact resume, many-shot instruction tuning.

Read top-down (docs/training.md for commands and formats):
    cli.py          `evalm train {tokenizer,pretrain,msit,msit-data,metaicl}`: one dict of subcommands
    tokenizer.py    byte-level BPE training (or an existing tokenizer) and encoding to shards
    shards.py       token-shard format: flat uint16/uint32 ids, document index, manifest; 8k+1 lines
    instructions.py MSIT's instruction rows {"task", "input", "output"}: read (streamed) and written
    packing.py      MSIT: templates, held-out clusters, whole-example packing, answer loss masks
    data.py         the line loader: seeded order per epoch, per-rank cursor (resumable)
    config.py       DataConfig, MsitDataConfig, OptimConfig, TrainConfig, CheckpointConfig
    schedule.py     the LR as a pure function of the step (warm-up, polynomial decay)
    parallelize.py  process group, device mesh, activation checkpointing, fully_shard per block
    checkpoint.py   DCP save/load, markers, keep_latest_k, resume path, architecture check
    metrics.py      the rank-0 progress line, metrics.jsonl, optional TensorBoard
    trainer.py      the loop shared by pretraining and MSIT
    pretrain.py     `python -m evalm.train.pretrain` / `torchrun -m evalm.train.pretrain`
    msit.py         `python -m evalm.train.msit` / `torchrun -m evalm.train.msit`
    msit_data.py    `evalm train msit-data`: synthetic episodes and instruction rows as MSIT jsonl
    local.py        one-process training through the trainer's step (the synthetic tiny model)
"""
