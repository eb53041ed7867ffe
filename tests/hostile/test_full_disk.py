"""A full disk under a command's lock is named, with the path (issue "Hostile inputs, fourth round").

    python -m pytest tests/hostile/test_full_disk.py -q

Writing FOLDER/.evalm.lock on a full disk ended as `bug: OSError: [Errno 28] No space left on
device`, naming no file (and its traceback could not be written either). The disk here is a real
one, a 64 KiB tmpfs filled to the last block (mounting needs root; elsewhere the test is skipped).
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.hostile.conftest import refused_in_process


@pytest.fixture
def full_disk(tmp_path):
    """A mounted 64 KiB tmpfs with no free block left."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        with open(disk / "filler", "wb") as f:
            try:
                f.write(b"\0" * (1 << 20))
                f.flush()
            except OSError:
                pass
        assert shutil.disk_usage(disk).free == 0
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_full_disk_under_the_lock_names_the_lock_file(full_disk):
    out = full_disk / "out"
    line = refused_in_process(["train", "recall", "--arch", "eva", "--width", "8", "--out", out])
    assert f"{out / '.evalm.lock'}: the disk is full" in line, line
    assert "free space on that disk or write to a folder on another one" in line, line
