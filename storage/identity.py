"""What a file is, by its bytes: the one identity every command records for its inputs.

A run decides whether earlier work still holds by comparing what it read then with what it reads
now: an evaluation's finished units, a data stage's inputs, a training run's tokenizer and data,
the stages of `evalm run`. A name says nothing (a task file edited in place, weights copied over
a model's file), and size plus modification time say too little (`cp other.safetensors model/ &&
touch -r old model/model.safetensors` keeps both). So the identity of a file is the SHA-256 of
its bytes, read in blocks (a model's weights are never held in memory whole), and of a folder the
SHA-256 of its files' relative names and digests.

Hashing a Pile-scale input set or a large model takes minutes, so a digest is cached under the
file's `stat`: size, modification time, inode, device and the inode's change time. The change
time is the kernel's own clock of the last write or metadata change; `touch -r` and a copy that
keeps the inode reset the modification time but cannot set it back, so a rewritten file is
always read again. A cache lives in one JSON file of the run folder that uses it
(`RunFolder.identity`); a damaged or foreign cache only costs the hashing again.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from evalm.storage.files import write_atomic

BLOCK = 1 << 20
"""Bytes read at a time: a model's weights are hashed in constant memory."""


def sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes (hex), read in BLOCK-sized pieces; never cached (a checkpoint's
    digest check must read the bytes that are there now)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            h.update(block)
    return h.hexdigest()


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def visible_files(folder: Path) -> list[Path]:
    """A folder's regular files at any depth, sorted, without hidden names (locks, markers, caches and
    temporary files that a run keeps beside its outputs change without changing what the folder holds);
    symbolic links to folders are not followed (a link loop cannot hang the walk)."""
    found = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [Path(root) / f for f in files if not f.startswith(".") and (Path(root) / f).is_file()]
    return sorted(found)


class DigestCache:
    """File digests keyed by path and `stat` stamp; kept in `file` (JSON) when one is given."""

    def __init__(self, file: str | Path | None = None):
        self.file = Path(file) if file is not None else None
        self.entries: dict[str, dict[str, Any]] = {}
        self.changed = False
        if self.file is not None and self.file.is_file():
            try:
                loaded = json.loads(self.file.read_text(encoding="utf-8"))
                self.entries = {k: v for k, v in loaded.items() if isinstance(v, dict)}
            except (OSError, ValueError, AttributeError):
                self.entries = {}  # a damaged cache only costs the hashing again

    def sha256(self, path: str | Path) -> str:
        """The file's SHA-256, read again only when its stamp changed (a regular file only: see `identity`)."""
        path = Path(path).resolve()
        key, stamp = str(path), _stamp(path.stat())
        known = self.entries.get(key)
        if known and known.get("stamp") == stamp and isinstance(known.get("sha256"), str):
            return known["sha256"]
        digest = sha256(path)
        self.entries[key] = {"stamp": stamp, "sha256": digest}
        self.changed = True
        return digest

    def identity(self, path: str | Path) -> str | None:
        """`sha256:HEX` of a file, or of a folder's visible files (relative names and digests); None when
        the path does not exist. What is not a regular file (a FIFO would block the read forever, a device
        never ends) is never read: `special:KIND`, left to the command that reads it to refuse."""
        path = Path(path)
        if not path.exists():
            return None
        if not path.is_dir():
            mode = path.stat().st_mode
            if not stat.S_ISREG(mode):
                return "special:" + ("fifo" if stat.S_ISFIFO(mode) else "device" if stat.S_ISCHR(mode) or
                                     stat.S_ISBLK(mode) else "socket")
            return "sha256:" + self.sha256(path)
        h = hashlib.sha256()
        for f in visible_files(path):
            h.update(f"{f.relative_to(path).as_posix()}\0{self.sha256(f)}\n".encode())
        return "sha256:" + h.hexdigest()

    def save(self) -> None:
        """Write the cache (whole or not at all) when a digest was computed since it was read."""
        if self.file is None or not self.changed:
            return
        write_atomic(self.file, json.dumps(self.entries, sort_keys=True))
        self.changed = False


def identity(path: str | Path) -> str | None:
    """`sha256:HEX` of a file or folder without a cache file (each file read once per call)."""
    return DigestCache().identity(path)
