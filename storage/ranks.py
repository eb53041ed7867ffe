"""Work done once, on rank 0, for every rank of a `torchrun` launch: its value, or its error, shared.

Taking a folder's lock, checking the recorded settings, finding the checkpoint to resume from:
each is done by one process for the whole launch, while the other ranks wait for it in a
collective. If rank 0 fails and says nothing, they wait forever; if it says only "rank 0 failed",
a bug of ours reads on every other rank like something the user should fix (or the reverse). So
rank 0 sends its value or its error's type, message and kind (a user error by
`config_toolkit.is_user_error`, or a bug), and every other rank raises the same kind: a `UserError`
with rank 0's message (one line, exit 2), or a `RankZeroFailed` naming rank 0's error type (a bug,
exit 1 with its traceback logged).

The broadcast is passed in (`torch.distributed.broadcast_object_list` under torchrun), so this
floor stays free of torch; a world of one needs none.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from evalm.config_toolkit import UserError, is_user_error

Broadcast = Callable[[list], None]
"""Sends rank 0's list in place to every rank (`lambda box: dist.broadcast_object_list(box, src=0)`)."""


class RankZeroFailed(RuntimeError):
    """Rank 0 hit a bug in work it did for every rank; this rank stops with it (a bug, not a user error)."""


@dataclass(frozen=True)
class Ranks:
    """This process's place among the ranks of one launch, and how rank 0 reaches the others."""

    rank: int = 0
    size: int = 1
    broadcast: Broadcast | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def share(self, action: Callable[[], Any]) -> Any:
        """`action()` run on rank 0 only and its value given to every rank. An error there is raised on
        every rank (the others would otherwise wait for rank 0 forever): rank 0's own, elsewhere a
        UserError with its message when it was a user error, else a RankZeroFailed (a bug)."""
        error, value = None, None
        if self.rank == 0:
            try:
                value = action()
            except Exception as err:  # noqa: BLE001 - re-raised below, after the other ranks heard of it
                error = err
        if self.size > 1:
            if self.broadcast is None:
                raise RuntimeError(f"Ranks(size={self.size}) without a broadcast cannot share rank 0's result")
            failure = None if error is None else (type(error).__name__, str(error), is_user_error(error))
            box = [(failure, value if error is None else None)]
            self.broadcast(box)  # rank 0's bytes through our own process group, not a file's
            failure, value = box[0]
            if failure is not None and error is None:
                name, message, user = failure
                if user:
                    raise UserError(message)
                raise RankZeroFailed(f"rank 0 failed with {name}: {message} (its traceback is in rank 0's log)")
        if error is not None:
            raise error
        return value
