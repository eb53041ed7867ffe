"""The GPU route's kernel (evalm/flex.py): `torch.nn.attention.flex_attention`, compiled once per
process, and what happens when it cannot serve a call.

A route that cannot silently degrade:
- compiled with dynamic=False, one kernel per shape and rule (evalm/flex.py pads a length to the next
  multiple of 128, so a bucket of lengths shares one); dynamo's recompile limit is raised to
  RECOMPILE_LIMIT for the kernel's own calls alone (never the process's setting), and past it the
  call fails (`fail_on_recompile_limit_hit`) instead of silently running flex's dense eager
  reference, which materialises every score and runs out of memory at long lengths;
- a kernel that does not compile on a device type (no working Triton or C++ compiler, a compiler
  error) is remembered for the process (`compiles_on` is then False, so `flex.usable_on` is too);
- either way the call raises `KernelUnavailable`, and EVA's layer answers it with the `recompute`
  route (plain PyTorch, linear memory) and one warning that says why (evalm/eva.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

RECOMPILE_LIMIT = 64
"""Compiled kernels per shape and score_mod a process may hold: a run holds a few (its lengths; with
dropout, the masked and the undropped call), tests and benchmarks more."""

_NOT_COMPILING: dict[str, str] = {}  # device type -> why flex_attention did not compile there, for the process


class KernelUnavailable(RuntimeError):
    """The compiled kernel cannot serve a call: it did not compile on this device type, or the process
    already holds RECOMPILE_LIMIT compiled kernels. The message says which, and what to do."""


@functools.cache
def module():
    """flex_attention's module and its `AuxRequest` (None before torch 2.9, where `return_lse` asks for
    ℓ), or None where this torch has no flex_attention."""
    try:
        from torch.nn.attention import flex_attention as found
    except ImportError:
        return None
    return found, getattr(found, "AuxRequest", None)


def compiles_on(device: torch.device) -> bool:
    """False once the kernel failed to compile on this device type in this process."""
    return device.type not in _NOT_COMPILING


@functools.cache
def compiled() -> Callable:
    """flex_attention compiled once per process (dynamic=False: one kernel per shape and rule); every
    EVA layer of a model calls it with the same rule object, so it compiles once per shape."""
    found, _ = module()
    return with_recompile_limit(torch.compile(found.flex_attention, dynamic=False))


def with_recompile_limit(kernel: Callable) -> Callable:
    """`kernel`, called with dynamo's recompile limit at RECOMPILE_LIMIT and a failure past it, for the
    call alone: both are read when a call would recompile, so the process's own settings stay as they
    were. Inside a graph being traced (a compiled block, train.compile) the call is inlined and
    compiles nothing. A compile failure or the limit raise `KernelUnavailable` (module docstring)."""

    def call(*args, **kwargs):
        if torch.compiler.is_compiling():
            return kernel(*args, **kwargs)
        config = torch._dynamo.config  # the limit's name before torch 2.7: cache_size_limit
        patch = {"recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit": RECOMPILE_LIMIT}
        if hasattr(config, "fail_on_recompile_limit_hit"):
            patch["fail_on_recompile_limit_hit"] = True
        try:
            with config.patch(**patch):
                return kernel(*args, **kwargs)
        except torch._dynamo.exc.FailOnRecompileLimitHit as err:
            raise KernelUnavailable(
                f"this process has compiled flex_attention {RECOMPILE_LIMIT} times (once per sequence length and "
                "rule); past that torch would run its dense eager reference, which holds every score") from err
        except torch._dynamo.exc.BackendCompilerFailed as err:
            device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "?")
            _NOT_COMPILING[device] = f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"
            raise KernelUnavailable(f"flex_attention did not compile on {device} ({_NOT_COMPILING[device]})") from err

    return call


def for_device(device: torch.device) -> Callable:
    """The compiled kernel on CUDA; elsewhere (CPU tests of the forward) the eager reference, which
    computes the same masked softmax densely (`flex_attention` compiles no CPU backward)."""
    return compiled() if device.type == "cuda" else module()[0].flex_attention
