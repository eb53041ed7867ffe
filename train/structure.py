"""How a tuning line is fed to the model: packed (every token sees the line before it) or under
the SAICL mask (each demonstration sees only itself; the test examples see every demonstration).

`packed` is EVALM §3.2: examples back to back with no attention reset. `saicl` trains the decoder
for the structure the `saicl` evaluation method gives it (SAICL §3.2, adapted to a decoder in
icl_eval/methods/decoder.py): each demonstration `[eos] I(x, y)` is encoded in a cache of its own from
position 0, the last `queries` examples of the line are test examples, each encoded after the
merged entries of every demonstration (`evalm.cache`), at position `ℓ`, right-aligned as at
evaluation. The loss is on the test examples' answers only: a demonstration alone cannot predict its
answer. No paper tunes a decoder this way; it is the fair test of `saicl` in a decoder.

A line under `saicl` must consist of examples of one token length ℓ (the synthetic family with a
one-token-per-letter template), since right-aligned groups of unequal length would need padding
that shifts EVA's blocks and chunks; anything else is refused with the line's shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from evalm.config_toolkit import ConfigError
from evalm.cache import Cache
from evalm.train.data import IGNORE


@dataclass(frozen=True)
class Packed:
    """Lines as they are (EVALM §3.2)."""

    def prepare(self, inputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        return inputs, targets

    def logits(self, model, inputs: Tensor, device) -> Tensor:
        return model(inputs.to(device))


@dataclass(frozen=True)
class SaiclMask:
    """Demonstrations in caches of their own, test examples over their merge (module docstring)."""

    eos_id: int
    queries: int = 8

    def prepare(self, inputs: Tensor, targets: Tensor) -> tuple[tuple[Tensor, Tensor], Tensor]:
        """(demonstrations (B·k, ℓ), tests (B·q, ℓ)) and the tests' targets (B·q, ℓ)."""
        width = example_length(inputs, self.eos_id)
        answer = torch.zeros_like(targets, dtype=torch.bool)
        answer[:, 1:] = targets[:, :-1] != IGNORE  # line position p is a target of the logit at p - 1
        n = min(complete_examples(inputs, answer, width, self.eos_id))
        if n < self.queries + 1:
            raise ConfigError(f"data.structure='saicl': a line holds {n} whole examples of {width} tokens, "
                              f"fewer than data.saicl_queries + 1 = {self.queries + 1}; raise data.seq_len")
        B = inputs.shape[0]
        units = inputs[:, : n * width].reshape(B, n, width)
        flags = answer[:, : n * width].reshape(B, n, width)
        eos = torch.full((B, n, 1), self.eos_id, dtype=inputs.dtype)
        segments = torch.cat([eos, units[..., :-1]], -1)  # [eos] I(x, y): the evaluator's group and test
        unit_targets = torch.where(flags, units, torch.full_like(units, IGNORE))
        k = n - self.queries
        demos = segments[:, :k].reshape(B * k, width)
        tests = segments[:, k:].reshape(B * self.queries, width)
        return (demos, tests), unit_targets[:, k:].reshape(B * self.queries, width)

    def logits(self, model, inputs: tuple[Tensor, Tensor], device) -> Tensor:
        demos, tests = (t.to(device) for t in inputs)
        width = demos.shape[1]
        n_layer = len(model.blocks)
        groups = Cache(n_layer=n_layer, batch_size=demos.shape[0])
        model(demos, cache=groups)  # every demonstration its own group, from position 0
        k = demos.shape[0] * self.queries // tests.shape[0]  # demonstrations per line
        prefix = []
        for state in groups.layers:
            keys, values = state.entries()  # (B·k, H, e, D): what a later token may attend to
            prefix.append(tuple(_per_line(t, k).repeat_interleave(self.queries, 0) for t in (keys, values)))
        test_cache = Cache(n_layer=n_layer, batch_size=tests.shape[0], position_offset=width, prefix=prefix)
        return model(tests, cache=test_cache)


def _per_line(t: Tensor, k: int) -> Tensor:
    """(B·k, H, e, D) -> (B, H, k·e, D): one line's demonstrations side by side, in order."""
    Bk, H, e, D = t.shape
    return t.reshape(Bk // k, k, H, e, D).permute(0, 2, 1, 3, 4).reshape(Bk // k, H, k * e, D)


def example_length(inputs: Tensor, eos_id: int) -> int:
    """ℓ: the tokens of one example with its eos, read off the first line; every line must agree."""
    lengths = set()
    for row in inputs:
        ends = (row == eos_id).nonzero().flatten()
        if len(ends) == 0:
            raise ConfigError("data.structure='saicl': a line has no eos, so it holds no whole example")
        lengths.add(int(ends[0]) + 1)
    if len(lengths) != 1:
        raise ConfigError(f"data.structure='saicl' needs examples of one token length; this batch has "
                          f"{sorted(lengths)} (use the synthetic family with a one-token-per-letter template)")
    return lengths.pop()


def complete_examples(inputs: Tensor, answer: Tensor, width: int, eos_id: int) -> list[int]:
    """Per line: how many leading examples of `width` tokens end in eos and carry an answer."""
    counts = []
    for row, flags in zip(inputs, answer):
        n = 0
        while (n + 1) * width <= len(row) and row[(n + 1) * width - 1] == eos_id and flags[n * width: (n + 1) * width].any():
            n += 1
        if n < (row[: len(row) - len(row) % width] != eos_id).reshape(-1, width)[:, :-1].any(-1).sum():
            raise ConfigError(f"data.structure='saicl' needs examples of one token length ({width} read off the "
                              "first); a line breaks that pattern (use the synthetic family's one-letter template)")
        counts.append(n)
    return counts


STRUCTURES = {"packed": Packed, "saicl": SaiclMask}
