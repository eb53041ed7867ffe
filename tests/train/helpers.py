"""Shared builders for tests/train: synthetic token shards and tiny run files on disk."""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np

from evalm.train.shards import ShardWriter

VOCAB = 64


def write_shards(folder: Path, *, n_docs: int = 60, seed: int = 0, vocab: int = VOCAB,
                 tokens_per_shard: int = 1500) -> dict:
    """Random documents of 20-80 ids (< vocab - 1; eos = vocab - 1) over several shards and 2 subsets."""
    rng = np.random.default_rng(seed)
    writer = ShardWriter(folder, vocab_size=vocab, eos_id=vocab - 1, tokenizer="synthetic",
                         tokens_per_shard=tokens_per_shard)
    for i in range(n_docs):
        writer.add(rng.integers(0, vocab - 1, rng.integers(20, 80)).tolist(), f"subset-{i % 2}")
    return writer.close()


def tiny_run_file(path: Path, shards: Path, *, steps: int = 6, save_every: int = 2, n_layer: int = 2,
                  attention: str = "eva", extra: str = "") -> Path:
    """A run file for a model small enough that 2 gloo ranks take well under a second per step.

    Dropout is on, so a resume that failed to restore the per-rank RNG would change the losses.
    """
    path.write_text(f"""
[model]
vocab_size = {VOCAB}
d_model = 32
n_layer = {n_layer}
n_head = 2
d_ff = 64
window_size = 8
chunk_size = 4
circular_period = 64
attention = "{attention}"
dropout = 0.1
attn_dropout = 0.1

[data]
shards = "{shards}"
seq_len = 32

[optim]
lr = 1e-2
warmup_steps = 2

[train]
steps = {steps}
batch_size = 2
grad_accum = 2
device = "cpu"
log_every = 1

[checkpoint]
save_every = {save_every}
keep_latest_k = 0
{extra}
""")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
