"""Ctrl-C during training: end the step in flight, agree across ranks, stop with the resume hint.

A KeyboardInterrupt raised at an arbitrary bytecode can land inside a checkpoint save (DCP's
writer threads, a barrier), inside a collective that the other ranks never finish, or in a
`finally` that waits on them; under load such a run was seen not to exit at all. So while the
loop runs (`deferred`), the first SIGINT only sets a flag: the loop checks it after each step,
all ranks agree with one all-reduce (a rank stopping alone would leave the others waiting in the
next collective), and the run stops between steps, where nothing is half-written. A watchdog
ends the process `GRACE_S` after the first Ctrl-C in any case, and a second Ctrl-C stops at
once; both print the same resume hint. Outside the loop (start-up, loading) Ctrl-C acts at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

GRACE_S = 60.0
"""Seconds from the first Ctrl-C to a forced exit, if the step in flight has not ended by then."""


class _State:
    requested = False
    deferring = False
    hint = ""


def _handler(signum, frame) -> None:
    if not _State.deferring or _State.requested:  # outside the loop, or a second Ctrl-C: now
        raise KeyboardInterrupt
    _State.requested = True
    print("Ctrl-C: stopping after the step in flight (Ctrl-C again to stop now)", file=sys.stderr, flush=True)
    watchdog = threading.Timer(GRACE_S, _force_exit)
    watchdog.daemon = True
    watchdog.start()


def _force_exit() -> None:
    print(f"the step in flight did not end within {GRACE_S:.0f} s of Ctrl-C; stopping now. {_State.hint}",
          file=sys.stderr, flush=True)
    os._exit(130)


def set_hint(hint: str) -> None:
    """What the forced exit prints: the command that resumes the run."""
    _State.hint = hint


@contextmanager
def deferred() -> Iterator[None]:
    """Within: the first SIGINT is deferred to the next `stop_requested` check. Main thread only
    (signal handlers can be set nowhere else); elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, _handler)
    _State.requested, _State.deferring = False, True
    try:
        yield
    finally:
        _State.deferring = False
        signal.signal(signal.SIGINT, previous)


def stop_requested(device: torch.device) -> bool:
    """Whether any rank was interrupted; collective, so every rank stops after the same step."""
    flag = torch.tensor(float(_State.requested), device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())
