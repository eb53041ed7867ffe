"""The counters a training run advances and a checkpoint restores (with the model, the optimizer,
the loader position and the RNG states, which have their own homes)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class TrainState:
    """Saved under the checkpoint's `train` key; the LR schedule is a pure function of `step`."""

    step: int = 0
    """Optimizer steps taken (a skipped non-finite batch counts: its data was consumed)."""
    tokens_seen: int = 0
    """Input tokens of every rank over all steps."""
    nonfinite_skips: int = 0
    """Batches skipped for a non-finite loss or gradient (train.nonfinite=skip)."""

    def checkpoint_entry(self, lines: int) -> dict[str, int]:
        """The `train` entry of a checkpoint; `lines` is the global line position all ranks reached."""
        return {**asdict(self), "lines": lines}

    @classmethod
    def from_checkpoint(cls, entry: dict[str, Any]) -> TrainState:
        """From a checkpoint's `train` entry (older checkpoints lack nonfinite_skips)."""
        return cls(step=int(entry["step"]), tokens_seen=int(entry["tokens_seen"]),
                   nonfinite_skips=int(entry.get("nonfinite_skips", 0)))
