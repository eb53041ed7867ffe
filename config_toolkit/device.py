"""A torch device the user named (`--device`, `[eval] device`, `train.device`), checked before anything is built;
and the CPU threads a command may take (`--threads`).

`--device cuda` on a CPU build of torch, or `--device bogus`, ended deep in loading as torch's own
assertion, reported as a bug. Here the name is read once: a name torch does not know, or a kind
evalm does not run on, is refused with the devices this machine has; CUDA on a torch without it
names the torch build and what to install; a GPU index past the machine's GPUs says how many there
are. torch is imported only when a device is checked, so this floor still loads nothing.
"""

from __future__ import annotations

import argparse
import os

from evalm.config_toolkit.errors import ConfigError

KINDS = ("cpu", "cuda", "mps")
"""The device kinds a model runs on here (torch knows more names: `meta` holds no values, the rest no backend)."""
CUDA_WHEELS = "https://download.pytorch.org/whl/cu126"
"""Where PyTorch's CUDA builds are; the cuXYZ is the CUDA version the driver supports (nvidia-smi shows it)."""


def valid_devices() -> list[str]:
    """The device names this machine and this torch can run on."""
    import torch

    names = ["cpu"]
    if torch.cuda.is_available():
        names += ["cuda", *(f"cuda:{i}" for i in range(torch.cuda.device_count()))]
    if torch.backends.mps.is_available():
        names.append("mps")
    return names


def device_problem(name: str) -> str | None:
    """What is wrong with running on device `name` here, with what to do; None when it can run."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        device = None
    if device is None or device.type not in KINDS:
        return f"not a device evalm runs on; valid on this machine: {', '.join(valid_devices())}"
    if device.type == "cuda":
        if torch.version.cuda is None and torch.version.hip is None:
            return (f"this torch ({torch.__version__}) is a CPU build, without CUDA; install PyTorch's CUDA build for "
                    f"your CUDA version (nvidia-smi shows it), e.g. pip install torch --index-url {CUDA_WHEELS}, "
                    "or run on cpu")
        if not torch.cuda.is_available():
            return (f"torch {torch.__version__} (CUDA {torch.version.cuda or torch.version.hip}) sees no GPU; check "
                    "nvidia-smi and CUDA_VISIBLE_DEVICES, or run on cpu")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            return f"this machine has {count} GPU(s), cuda:0 to cuda:{count - 1}"
    if device.type == "mps" and not torch.backends.mps.is_available():
        return f"this torch ({torch.__version__}) or machine has no MPS (Apple GPU); valid: {', '.join(valid_devices())}"
    return None


def device_flag(name: str) -> str:
    """`--device`'s argparse type: the name when it can run here, else argparse's one-line error naming the flag."""
    problem = device_problem(name)
    if problem:
        raise argparse.ArgumentTypeError(f"{name!r}: {problem}")
    return name


def check_device(name: str, where: str) -> None:
    """Refuse device `name` given at `where` (a config key, a flag) when it cannot run here."""
    problem = device_problem(name)
    if problem:
        raise ConfigError(f"{where} {name!r}: {problem}")


def check_threads(threads: int, flag: str = "--threads") -> None:
    """Torch threads from 1 to this machine's CPUs (a million ended as a MemoryError, 0 as torch's RuntimeError)."""
    cpus = os.cpu_count() or 1
    if not 1 <= threads <= cpus:
        raise ConfigError(f"{flag} {threads}: from 1 to this machine's {cpus} CPUs")
