"""The line loader: which lines a rank reads, in what order, and where it stands (resumable).

A line source (`shards.PretrainLines` or `msit.PackedLines`) gives line i as tokens (T + 1,) and an
optional loss mask (T + 1,). The loader turns a global line counter into lines: epoch e visits
the lines in a permutation that is a pure function of (seed, e), and rank r of W takes global
positions start + r, start + r + W, start + r + 2W, ... Ranks step in lockstep, so at every
optimizer-step boundary the lines consumed by all ranks together are exactly the global prefix
[0, start + cursor x W): one integer, `position`, saved in every checkpoint. A resume on any world size and any global batch sets `start` to that position, so no
line is repeated or skipped.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

IGNORE = -100  # targets the loss skips (evalm's cross-entropy ignore_index)


class LineSource(Protocol):
    seq_len: int

    def __len__(self) -> int: ...

    def line(self, i: int) -> tuple[np.ndarray, np.ndarray | None]: ...


class LineLoader:
    """Batches of (inputs, targets), each (B, T) long, for one rank; `cursor` is its position."""

    def __init__(self, source: LineSource, *, rank: int, world_size: int, batch_size: int,
                 shuffle: bool, seed: int):
        self.source, self.rank, self.world_size = source, rank, world_size
        self.batch_size, self.shuffle, self.seed = batch_size, shuffle, seed
        self.start = 0  # global position this world began at (a resume's saved position)
        self.cursor = 0  # lines this rank consumed since `start`
        self._order_epoch, self._order = -1, np.empty(0, dtype=np.int64)

    def line_index(self, position: int) -> int:
        """The line at a global position: epoch = position // n, then that epoch's permutation."""
        epoch, offset = divmod(position, len(self.source))
        if epoch != self._order_epoch:
            n = len(self.source)
            rng = np.random.default_rng([self.seed, epoch])
            self._order = rng.permutation(n) if self.shuffle else np.arange(n)
            self._order_epoch = epoch
        return int(self._order[offset])

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch_size lines of this rank; targets are IGNORE where the mask is 0."""
        tokens, targets = [], []
        for _ in range(self.batch_size):
            line, mask = self.source.line(self.line_index(self.start + self.cursor * self.world_size + self.rank))
            self.cursor += 1
            target = line[1:].copy()
            if mask is not None:
                target[~mask[1:].astype(bool)] = IGNORE
            tokens.append(line[:-1])
            targets.append(target)
        return torch.from_numpy(np.stack(tokens)), torch.from_numpy(np.stack(targets))

    @property
    def position(self) -> int:
        """Lines all ranks consumed together (valid at a step boundary, where ranks are in lockstep)."""
        return self.start + self.cursor * self.world_size

    @property
    def epoch(self) -> float:
        return self.position / len(self.source)

    def seek(self, position: int) -> None:
        """Continue after the global prefix [0, position), on this loader's world size and batch."""
        self.start, self.cursor = int(position), 0

    def state_dict(self) -> dict[str, int]:
        return {"cursor": self.cursor, "world_size": self.world_size, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue after the lines all ranks consumed; checkpoints before `position` was saved
        started at 0, so theirs is cursor x world size."""
        position = state.get("position")
        self.seek(int(state["cursor"]) * int(state["world_size"]) if position is None else int(position))
