"""What a model and a batch will take in memory, estimated before anything is allocated.

`--set model.n_layer=1e9` or `--set train.batch_size=1e9` grew a process for minutes without a line
of output until the kernel killed it; `d_model=1e9` or `vocab_size=1e12` ended in an allocator's
error reported as a bug. A config is data, and its sizes are checked like any other input: the
bytes a run must hold are estimated from the shape alone, and a run that cannot fit is refused in
one line that gives the estimate and what the machine has (`check_fits`).

The estimates are lower bounds (the run needs at least this), so a refusal is never wrong, and
whatever passes is left to run: parameters count the embedding and each block's attention and MLP
matrices (4 d² + 2 d d_ff; norms, biases and EVA's maps come on top); training holds each parameter
4 times (weights, gradients, AdamW's two moments) in float32, divided over the ranks FSDP shards it
across, and a micro-batch's logits and their gradient (B x T x V floats, twice). What is available:
on a GPU the free device memory; on the CPU the kernel's MemAvailable, or less under an address-space
limit (`ulimit -v`) after what the process has mapped already.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

from evalm.config_toolkit import UserError

FLOAT32 = 4
TRAINING_COPIES = 4
"""Weights, gradients and AdamW's two moments, per parameter."""
GiB = 1 << 30


class TooLarge(UserError, MemoryError):
    """A model or batch whose estimated memory exceeds what the machine has; the message gives both."""


def parameters(vocab_size: int, d_model: int, n_layer: int, d_ff: int) -> int:
    """A lower bound on a decoder's parameters: the embedding and each block's four attention and two MLP matrices."""
    return vocab_size * d_model + n_layer * (4 * d_model * d_model + 2 * d_model * d_ff)


def training_bytes(n_params: int, vocab_size: int, tokens_per_micro_batch: int, world_size: int = 1) -> int:
    """At least what one rank holds to train: its share of the parameters (four float32 copies) and one
    micro-batch's logits with their gradient."""
    return TRAINING_COPIES * FLOAT32 * n_params // max(world_size, 1) + 2 * FLOAT32 * tokens_per_micro_batch * vocab_size


def available_bytes(device: str = "cpu") -> int:
    """Memory this process can still take on `device` (module docstring)."""
    if str(device).startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            free, _ = torch.cuda.mem_get_info(torch.device(device))
            return int(free)
    room = _meminfo("MemAvailable")
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        room = min(room, max(soft - _mapped(), 0))
    return room


def _meminfo(key: str) -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _mapped() -> int:
    """Bytes of address space this process has mapped (VmSize), what `ulimit -v` counts."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def shown(n: int) -> str:
    """Bytes in words: `3.2 GiB`, `2.1e+04 GiB`."""
    value = n / GiB
    return f"{value:.1f} GiB" if value < 1e4 else f"{value:.1e} GiB"


def check_fits(need: int, what: str, device: str = "cpu") -> None:
    """Refuse `what` when it needs more than `device` has (`need`: a lower bound, in bytes)."""
    room = available_bytes(device)
    if need > room:
        raise TooLarge(f"{what} needs at least {shown(need)} of memory, and {device} has {shown(room)} available; "
                       "choose a smaller shape or batch (or a machine with more memory)")
