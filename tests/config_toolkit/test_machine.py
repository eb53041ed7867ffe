"""The machine readers against what the kernel and `lscpu` say.

    pytest tests/config_toolkit/test_machine.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evalm.config_toolkit.machine import device_name, peak_gpu_gib, peak_memory_gib, peak_rss_gib


def vm_hwm_gib() -> float:
    """The kernel's own high-water mark of this process's resident set (/proc/self/status, kB)."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 2**20


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="Linux's /proc")
def test_the_peak_resident_set_is_the_kernels_high_water_mark():
    held = bytearray(300 * 2**20)  # raise the peak well above the interpreter's own
    held[:: 4096] = b"x" * len(held[:: 4096])  # touch every page: resident, not just reserved
    assert abs(peak_rss_gib() - vm_hwm_gib()) < 0.01  # the same counter, read twice (pages may come between)
    assert peak_rss_gib() > 0.29
    assert peak_memory_gib("cpu") == peak_rss_gib() and peak_gpu_gib("cpu") is None


CHILD = ("b = bytearray(600 * 2**20); b[::4096] = b'x' * len(b[::4096]); "
         "print(next(x for x in open('/proc/self/status') if x.startswith('VmHWM:')).split()[1])")
PARENT = f"""
import subprocess, sys
from evalm.config_toolkit.machine import peak_rss_gib
child_kib = subprocess.run([sys.executable, "-c", {CHILD!r}], check=True, capture_output=True, text=True).stdout
print(peak_rss_gib(), peak_rss_gib(children=True), int(child_kib) / 2**20)
"""


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="Linux's /proc")
def test_a_finished_childs_peak_counts_with_children():
    # a fresh parent: this test process's peak depends on what ran before it; the child names its own peak
    # (a forked child's high-water mark starts at its parent's, so the parent's own peak is not below it)
    out = subprocess.run([sys.executable, "-c", PARENT], check=True, capture_output=True, text=True).stdout
    own, with_children, child = map(float, out.split())
    assert child > 0.58 and abs(with_children - max(own, child)) < 0.01


@pytest.mark.skipif(shutil.which("lscpu") is None, reason="no lscpu")
def test_the_cpu_is_named_as_lscpu_names_it():
    lines = subprocess.run(["lscpu"], capture_output=True, text=True, env={"LC_ALL": "C"}).stdout.splitlines()
    names = [x.split(":", 1)[1].strip() for x in lines if x.startswith("Model name:")]
    if not names:
        pytest.skip("lscpu names no model here")
    assert device_name("cpu") == names[0]


def test_a_cuda_device_is_named_and_its_peak_read_by_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.cuda.reset_peak_memory_stats()
    held = torch.empty(2**28, dtype=torch.uint8, device="cuda")  # 256 MiB
    assert peak_gpu_gib("cuda") >= 0.25 and peak_memory_gib(torch.device("cuda")) == peak_gpu_gib("cuda")
    assert device_name("cuda") == torch.cuda.get_device_name() and held.numel()
