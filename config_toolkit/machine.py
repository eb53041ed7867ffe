"""What ran a command and how much memory it took: the device's name and the peak memory readers.

On the ground floor because every floor records them: the trainer's log line (`train.trainer`), the
stage markers of `evalm run` (`launcher.markers`) and the benchmarks' cost records. torch is imported
only when a CUDA device is asked about, so reading the resident set loads nothing.
"""

from __future__ import annotations

import contextlib
import platform
import resource
from collections.abc import Iterator
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def peak_rss_gib(children: bool = False) -> float:
    """Peak resident set of this process in GiB (Linux's ru_maxrss is KiB); with `children`, the larger of
    it and the largest finished child's (a data stage's workers, a study's steps)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if children:
        own = max(own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
    return own / 2**20


def peak_gpu_gib(device) -> float | None:
    """Peak CUDA memory allocated on `device` (a name or a torch.device) in GiB; None off CUDA."""
    if not str(device).startswith("cuda"):
        return None
    import torch

    return torch.cuda.max_memory_allocated(device) / 2**30


def peak_memory_gib(device) -> float:
    """The peak that bounds a run on `device`: CUDA memory allocated there, or this process's resident set."""
    gpu = peak_gpu_gib(device)
    return peak_rss_gib() if gpu is None else gpu


def device_name(device="cpu") -> str:
    """What ran it: the GPU's name, or the CPU's model name (`lscpu`'s, from /proc/cpuinfo)."""
    if str(device).startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(device)
    for line in CPUINFO.read_text().splitlines() if CPUINFO.is_file() else ():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "cpu"


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op threads at `count` inside the block, as they were after it: a command's --threads
    is its own, not a setting left on the process (or on the tests that call the command's function)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
