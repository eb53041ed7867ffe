"""A folder's files with their sizes and SHA-256, so that a damaged copy is found before it is used.

A checkpoint's marker says that a save finished; it cannot say that the bytes are still those
that were written (a disk error, a copy cut short, a file edited by hand). `write_digest` records
every file of a finished folder; `verify_digest` re-reads them and names the first that differs.
Sizes are compared first, so a truncated file is found without reading it.
"""

from __future__ import annotations

import json
from pathlib import Path

from evalm.storage.files import DamagedFile, regular, write_atomic
from evalm.storage.identity import sha256

DIGEST_FILE = "digest.json"


def _files(folder: Path, exclude: set[str]) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.relative_to(folder).as_posix() not in exclude)


def write_digest(folder: str | Path, exclude: tuple[str, ...] = ()) -> Path:
    """Write FOLDER/digest.json: {relative path: {size, sha256}} of every file but `exclude`."""
    folder = Path(folder)
    files = _files(folder, {DIGEST_FILE, *exclude})
    record = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": sha256(p)} for p in files}
    return write_atomic(folder / DIGEST_FILE, json.dumps({"files": record}, indent=1) + "\n")


def verify_digest(folder: str | Path) -> str | None:
    """None when every recorded file is there with its size and hash; else what is wrong, naming the file.
    A folder without digest.json (written before digests existed) cannot be checked and passes."""
    folder = Path(folder)
    path = folder / DIGEST_FILE
    if not path.is_file():
        return None
    try:
        files = json.loads(path.read_text(encoding="utf-8"))["files"]
    except (ValueError, KeyError, TypeError):
        return f"{path} is damaged (not the digest JSON it was written as)"
    for name, want in files.items():
        f = folder / name
        if not f.is_file():
            return f"{f} is missing"
        size = f.stat().st_size
        if size != want["size"]:
            return f"{f} has {size} bytes, {want['size']} were written (truncated or replaced)"
    for name, want in files.items():
        if sha256(folder / name) != want["sha256"]:
            return f"{folder / name} does not hash to what was written (its bytes changed)"
    return None


def weights_digest(folder: str | Path, file: str = "model.safetensors") -> str:
    """SHA-256 of a folder's tensors (for each name in sorted order: `NAME DTYPE SHAPE`, then its bytes): the
    same weights give the same digest on any machine, whatever metadata `save_pretrained` wrote into the
    file's header (which `write_digest`'s file hash would count). Reads safetensors through torch, lazily."""
    import hashlib

    import torch
    from safetensors import SafetensorError, safe_open

    digest, path = hashlib.sha256(), Path(folder) / file
    regular(path, "a weights file")
    try:
        with safe_open(str(path), framework="pt") as f:
            for name in sorted(f.keys()):
                t = f.get_tensor(name).contiguous()
                digest.update(f"{name} {t.dtype} {tuple(t.shape)}".encode())
                digest.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    except (SafetensorError, ValueError, RuntimeError) as err:  # cut short, or not safetensors at all
        raise DamagedFile(f"{path}: not a readable safetensors file ({str(err)[:120]}); restore it or write it "
                          "again with the command that made it") from None
    return digest.hexdigest()
