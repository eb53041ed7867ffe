"""The recall study's token data (Zoology's protocol, Arora et al. 2023): MQAR, the passkey copy and far
MQAR as seeded numpy arrays, and the training batch that mixes them. No torch, no files.

- MQAR, Zoology's multi-query associative recall (`zoology/data/multiquery_ar.py`): `kv` key-value
  pairs (keys from one half of the vocabulary, values from the other), then the keys again at
  power-law gaps (power_a = 0.01) among random tokens, each to be answered with its value;
- the passkey copy: random tokens, PASS and a 4-token passkey at a random position, then ASK, after
  which the passkey is to be repeated;
- far MQAR: `kv` pairs at the start, random tokens, every key queried at the end.

Every generator returns inputs and labels (n, seq_len), labels -100 where nothing is asked; the
label at position t is the token the model must give after reading position t. The trainer
(`evalm train recall`, train/recall.py) and the test cells (`evalm eval recall-cells`,
icl_eval/recall/study_cells.py) both draw from here, so a model is tested on the data it was trained on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PASSKEY_TOKENS = 4
"""Tokens of one passkey (scored as one exact match)."""
UNLABELLED = -100
"""A label nothing is asked at (the trainer's ignore index)."""
PASSKEY_LENGTH = 2 * PASSKEY_TOKENS + 3
"""The shortest passkey copy: PASS and the passkey at a random position, ASK and the passkey at the end."""
FAR_PAIRS = 8
"""The pairs of far MQAR: at the start and again at the end, so a far-MQAR sequence is at least 4x as long."""


@dataclass(frozen=True)
class Vocab:
    """Zoology's two halves of `v` tokens: keys 1 .. v/2 - 1, values v/2 .. v - 1; then PASS = v and
    ASK = v + 1 (0 unused)."""

    v: int

    @property
    def keys(self) -> tuple[int, int]:
        return 1, self.v // 2

    @property
    def values(self) -> tuple[int, int]:
        return self.v // 2, self.v

    @property
    def pass_token(self) -> int:
        return self.v

    @property
    def ask_token(self) -> int:
        return self.v + 1

    @property
    def size(self) -> int:
        """The model's vocabulary: both halves, PASS and ASK."""
        return self.v + 2


def mqar(rng: np.random.Generator, n: int, seq_len: int, kv: int, vocab: Vocab, power_a: float = 0.01):
    """Zoology's multiquery_ar with random non-queries: inputs and labels (n, seq_len)."""
    inputs, labels = np.zeros((n, seq_len + 1), np.int64), np.full((n, seq_len + 1), UNLABELLED, np.int64)
    space = (seq_len - 2 * kv) // 2
    p = power_a * np.arange(1, space + 1) ** (power_a - 1)
    p /= p.sum()
    for i in range(n):
        keys = rng.choice(np.arange(*vocab.keys), kv, replace=False)
        values = rng.choice(np.arange(*vocab.values), kv, replace=False)
        gaps = rng.choice(space, kv, replace=False, p=p)
        inputs[i, 0 : 2 * kv : 2], inputs[i, 1 : 2 * kv : 2] = keys, values
        inputs[i, 2 * kv + 2 * gaps] = keys
        labels[i, 2 * kv + 2 * gaps + 1] = values
    filler = rng.integers(1, vocab.values[1], inputs.shape)
    inputs = np.where(inputs == 0, filler, inputs)
    return inputs[:, :-1], labels[:, 1:]


def passkey(rng: np.random.Generator, n: int, seq_len: int, vocab: Vocab):
    """Random tokens, PASS + passkey at a uniform position, ASK + passkey at the end; labels on the repeat."""
    k = PASSKEY_TOKENS
    inputs = rng.integers(1, vocab.values[1], (n, seq_len + 1))
    labels = np.full((n, seq_len + 1), UNLABELLED, np.int64)
    for i in range(n):
        key = rng.integers(*vocab.values, k)
        at = int(rng.integers(0, seq_len - 2 * k - 2))
        inputs[i, at], inputs[i, at + 1 : at + 1 + k] = vocab.pass_token, key
        inputs[i, seq_len - k], inputs[i, seq_len - k + 1 :] = vocab.ask_token, key
        labels[i, seq_len - k + 1 :] = key
    return inputs[:, :-1], labels[:, 1:]


def mqar_far(rng: np.random.Generator, n: int, seq_len: int, vocab: Vocab, kv: int = FAR_PAIRS):
    """kv pairs at the start, random tokens, every key queried at the end (teacher-forced, Zoology's labels)."""
    inputs = rng.integers(1, vocab.values[1], (n, seq_len + 1))
    labels = np.full((n, seq_len + 1), UNLABELLED, np.int64)
    for i in range(n):
        keys = rng.choice(np.arange(*vocab.keys), kv, replace=False)
        values = rng.choice(np.arange(*vocab.values), kv, replace=False)
        inputs[i, 0 : 2 * kv : 2], inputs[i, 1 : 2 * kv : 2] = keys, values
        order = rng.permutation(kv)
        tail = seq_len + 1 - 2 * kv
        inputs[i, tail::2], inputs[i, tail + 1 :: 2] = keys[order], values[order]
        labels[i, tail + 1 :: 2] = values[order]
    return inputs[:, :-1], labels[:, 1:]


def training_batch(rng: np.random.Generator, *, batch_size: int, seq_len: int, train_kv: Sequence[int],
                   mqar_share: float, vocab: Vocab) -> tuple[np.ndarray, np.ndarray]:
    """`mqar_share` of the batch MQAR (`kv` drawn per sequence from `train_kv`), the rest passkey copy:
    inputs and labels (batch_size, seq_len), the MQAR rows first."""
    n_mqar = round(batch_size * mqar_share)
    parts = [mqar(rng, 1, seq_len, int(rng.choice(train_kv)), vocab) for _ in range(n_mqar)]
    parts.append(passkey(rng, batch_size - n_mqar, seq_len, vocab))
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
