"""Pinning EVA's path in a test: `choose` (evalm/eva_paths.py) decides as if some facts of the call
were different, so the production module carries no test switch.

    with forced(**PLAIN): ...   # a whole sequence takes "recompute" (plain PyTorch), not the kernel
    with forced(**TILES): ...   # a whole sequence takes the tiled autograd path, the oracle it had
    with forced(**SELECTION_KERNEL): ...   # selection without a graph puts its shared key sets on the kernel
    with recorded() as taken: ...   # taken: the path of every EVA call in the block
"""

from __future__ import annotations

import contextlib
import dataclasses

from evalm import eva_paths

PLAIN = {"kernel": False}  # as if the fused CPU kernel were unavailable
TILES = {"whole": False}  # as if a cache were given: query tiles, autograd's own backward
SELECTION_KERNEL = {"new_tokens": eva_paths.KERNEL_ROWS}  # as if long enough for selection's kernel path


@contextlib.contextmanager
def forced(**facts):
    """Within the block, every EVA call is routed as if its `EvaCall` had these facts."""
    real = eva_paths.choose

    def choose(call: eva_paths.EvaCall) -> eva_paths.EvaPath:
        return real(dataclasses.replace(call, **facts))

    eva_paths.choose = choose
    try:
        yield
    finally:
        eva_paths.choose = real


@contextlib.contextmanager
def recorded():
    """Within the block, the `EvaPath` of every EVA call is appended to the list it yields."""
    real, taken = eva_paths.choose, []

    def choose(call: eva_paths.EvaCall) -> eva_paths.EvaPath:
        taken.append(real(call))
        return taken[-1]

    eva_paths.choose = choose
    try:
        yield taken
    finally:
        eva_paths.choose = real
