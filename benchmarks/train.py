"""Training throughput at 8k tokens per line on CPU: EVA vs full attention, and loader vs trainer.

    python benchmarks/train.py                  # about 1.5 minutes on 2 cores
    python benchmarks/train.py --seq-len 4096 --steps 2 --json out.json

Measures, in one process (a world of one, the same FSDP2 + AdamW step as `evalm train pretrain`):
1. training tokens/s of the tiny model (configs/pretrain-tiny.toml's shape) with `attention = "eva"`
   and with `"full"` (exact causal softmax via SDPA), each after a warm-up step, and their ratio;
2. the line loader's tokens/s reading 8k+1 windows from memory-mapped token shards, against the
   trainer's consumption (goal: loader >= 10x trainer).
"""

from __future__ import annotations

from json import dumps
import sys
import tempfile
import time
from pathlib import Path

import timing  # this folder's, before the folder leaves sys.path

# Run as a script, this file's folder comes first on sys.path and its name `train` would shadow
# the `train` package: drop that entry (`python -m benchmarks.train` needs no such help).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import numpy as np
import torch
import torch.distributed as dist

from evalm.config_toolkit import read_toml
from evalm import ModelConfig
from evalm.train.data import LineLoader
from evalm.train.parallelize import BuildPlan, build_model, init_distributed, weight_decay_groups
from evalm.train.shards import PretrainLines, ShardWriter, TokenShards
from evalm.train.loop import Loop, run_steps, train_step

ROOT = Path(__file__).resolve().parents[1]


def make_shards(folder: Path, vocab: int, n_tokens: int) -> TokenShards:
    """Random documents of 500-5000 ids, enough tokens for many 8k lines."""
    rng = np.random.default_rng(0)
    writer = ShardWriter(folder, vocab_size=vocab, eos_id=vocab - 1, tokenizer="synthetic",
                         tokens_per_shard=n_tokens // 4)
    written = 0
    while written < n_tokens:
        doc = rng.integers(0, vocab - 1, int(rng.integers(500, 5000)))
        writer.add(doc.tolist(), "synthetic")
        written += len(doc) + 1
    writer.close()
    return TokenShards(folder)


def trainer_tokens_per_s(model_config: ModelConfig, runtime, lines: PretrainLines, steps: int) -> float:
    """Tokens/s of full optimizer steps (forward, backward, clip, AdamW), after one warm-up step."""
    model = build_model(model_config, runtime, BuildPlan(seed=0))
    optimizer = torch.optim.AdamW(weight_decay_groups(model, 0.1), lr=1e-4)
    loader = LineLoader(lines, rank=0, world_size=1, batch_size=1, shuffle=True, seed=0)
    model.train()
    train_step(model, optimizer, loader, runtime)  # warm-up: allocator, first-call costs
    started = time.perf_counter()
    run_steps(model, optimizer, loader, runtime, Loop(0, steps, train_step))
    return steps * lines.seq_len / (time.perf_counter() - started)


def loader_tokens_per_s(lines: PretrainLines, n_lines: int) -> float:
    """Tokens/s of `LineLoader.next_batch` (memmap read, shift, tensor), shuffled order."""
    loader = LineLoader(lines, rank=0, world_size=1, batch_size=1, shuffle=True, seed=0)
    loader.next_batch()
    started = time.perf_counter()
    for _ in range(n_lines):
        loader.next_batch()
    return n_lines * lines.seq_len / (time.perf_counter() - started)


def main(seq_len: int = 8192, steps: int = 1, attn_dropout: float | None = None, json: str | None = None) -> None:
    """`steps` timed optimizer steps per attention (full: ~40 s each at 8k); `attn_dropout` overrides the
    config's (0 lets full attention use SDPA's fused CPU kernel); `json` also writes the figures there."""
    print(timing.machine())
    base = read_toml(ROOT / "configs" / "pretrain-tiny.toml")["model"]
    # the tiny shape, with positions covering the whole line
    base = {**base, "circular_period": seq_len}
    if attn_dropout is not None:
        base["attn_dropout"] = attn_dropout
    runtime = init_distributed("cpu")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            lines = PretrainLines(make_shards(Path(tmp), base["vocab_size"], 64 * seq_len), seq_len)
            figures = {"seq_len": seq_len, "threads": torch.get_num_threads(),
                       "model": {k: base[k] for k in ("d_model", "n_layer", "n_head", "window_size", "chunk_size",
                                                       "dropout", "attn_dropout")}}
            for attention in ("eva", "full"):
                cfg = ModelConfig(**{**base, "attention": attention})
                figures[f"train_tok_s_{attention}"] = trainer_tokens_per_s(cfg, runtime, lines, steps)
            figures["loader_tok_s"] = loader_tokens_per_s(lines, 200)
    finally:
        dist.destroy_process_group()
    figures["eva_over_full"] = figures["train_tok_s_eva"] / figures["train_tok_s_full"]
    figures["loader_over_trainer"] = figures["loader_tok_s"] / max(figures["train_tok_s_eva"], figures["train_tok_s_full"])
    print(f"seq_len {seq_len}, {figures['threads']} thread(s), tiny model {figures['model']}")
    print(f"train tokens/s   eva {figures['train_tok_s_eva']:>12,.0f}   full {figures['train_tok_s_full']:>12,.0f}"
          f"   eva/full {figures['eva_over_full']:.2f}x")
    print(f"loader tokens/s  {figures['loader_tok_s']:>12,.0f}   loader/trainer {figures['loader_over_trainer']:,.0f}x"
          f"   (goal >= 10x: {'met' if figures['loader_over_trainer'] >= 10 else 'NOT met'})")
    if json:
        Path(json).write_text(dumps(figures, indent=2))


if __name__ == "__main__":
    raise SystemExit(timing.cli(main, __doc__))
