"""A GGUF file named by `--gguf-file`, checked before any library reads it.

`--gguf-file NAME` is a file inside `--hf-model DIR`. `transformers` (through the `gguf` package)
opened whatever path the two made (`../../etc/passwd` too), blocked forever on a FIFO, and trusted
the header's counts: a crafted file claiming 2^62 tensors or a string of 2^62 bytes ended in a
MemoryError or an IndexError reported as a bug. `check_gguf` refuses, in one line naming the file:

- a name that leaves the folder (after links are followed);
- anything but a regular file;
- a file whose header is not GGUF (magic `GGUF`, version 2 or 3), or whose counts, strings, arrays,
  tensor dimensions and offsets do not fit inside the file: the whole header is walked with each
  length checked against the bytes that remain before anything of that length is read;
- a tensor whose data (its elements in its type's bytes, from the header's aligned end) runs past
  the end of the file (a file cut short), and a `{arch}.block_count` above the blocks the file holds
  tensors of (`transformers` built every block claimed: 100,000 of them grew memory while it ran).

What the walk read comes back as a `GGUFSummary`; its parameter count is the memory estimate made
before any model is built (evalm/hf_folder.py).

The format: magic, version (u32), tensor count and key/value count (u64), the key/values (a string
key, a u32 type, a value; a string is a u64 length and its bytes; an array a u32 type, a u64 count
and its items), then per tensor its name, n_dims (u32), dims (u64 each), type (u32) and offset (u64).
"""

from __future__ import annotations

import math
import mmap
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from evalm.config_toolkit import InputError
from evalm.storage import regular
from evalm.storage.run_folder import inside

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_DIMS = 4
"""GGML_MAX_DIMS: a tensor has at most four dimensions."""
MAX_ARRAY_DEPTH = 2
"""Arrays of arrays are allowed one level deep (none of llama.cpp's keys nests further)."""
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
ALIGNMENT = 32
"""The tensor data starts at the header's end rounded up to this, or to `general.alignment`."""
QK = 256
TYPE_BYTES = {0: (1, 4), 1: (1, 2), 30: (1, 2), 28: (1, 8), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8),
              2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34), 9: (32, 40),
              10: (QK, 4 + QK // 16 + QK // 4), 11: (QK, 2 + QK // 4 + QK // 8 + 12), 12: (QK, 4 + QK // 2 + 12),
              13: (QK, 4 + QK // 2 + QK // 8 + 12), 14: (QK, 2 + QK // 2 + QK // 4 + QK // 16),
              15: (QK, 4 + QK + QK // 8)}
"""ggml type -> (elements per block, bytes per block), as the `gguf` package's GGML_QUANT_SIZES; a newer type
not here is bounded by its offset alone."""
BLOCK = re.compile(r"blk\.(\d+)\.")
"""llama.cpp's tensor names: `blk.N.` for block N."""


@dataclass(frozen=True)
class GGUFSummary:
    """What the walk of a GGUF header read: its tensor count and their parameters (the memory estimate)."""

    tensors: int
    parameters: int


@dataclass(frozen=True)
class _Tensor:
    name: str
    elements: int
    kind: int
    offset: int


class NotGGUF(InputError):
    """A `--gguf-file` outside its folder, not a regular file, or whose header cannot be a GGUF's."""


class _Reader:
    """The file's bytes read forward, each length checked against what remains."""

    def __init__(self, path: Path, data):
        self.path, self.data, self.at = path, data, 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or n > len(self.data) - self.at:
            raise NotGGUF(f"{self.path}: {what} needs {n} bytes at offset {self.at}, but the file has "
                          f"{len(self.data) - self.at} left (a damaged or crafted GGUF file); download it again")
        part = self.data[self.at:self.at + n]
        self.at += n
        return part

    def scalar(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def count(self, what: str, item_bytes: int) -> int:
        """A u64 count of items of at least `item_bytes` bytes each, bounded by what the file still holds."""
        n = self.scalar("<Q", what)
        if n * max(item_bytes, 1) > len(self.data) - self.at:
            raise NotGGUF(f"{self.path}: {what} is {n}, more than the {len(self.data) - self.at} bytes left could "
                          "hold (a damaged or crafted GGUF file); download it again")
        return n

    def string(self, what: str) -> str:
        raw = self.take(self.count(f"the length of {what}", 1), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise NotGGUF(f"{self.path}: {what} is not UTF-8 (a damaged GGUF file); download it again") from None

    def value(self, kind: int, what: str, depth: int = 0):
        """A scalar's or string's value; an array is read past (None: never kept)."""
        if kind in SCALARS:
            return self.scalar(SCALARS[kind], what)
        if kind == STRING:
            return self.string(what)
        if kind == ARRAY and depth < MAX_ARRAY_DEPTH:
            item = self.scalar("<I", f"the item type of {what}")
            size = struct.calcsize(SCALARS[item]) if item in SCALARS else 8  # a string or array: its u64 length
            for _ in range(self.count(f"the length of {what}", size)):
                self.value(item, what, depth + 1)
            return None
        raise NotGGUF(f"{self.path}: {what} has value type {kind}, which GGUF does not define (a damaged or "
                      "crafted GGUF file); download it again")


def walk(path: Path) -> GGUFSummary:
    """Walk the whole header of `path` and check what it claims (module docstring)."""
    with open(path, "rb") as f:
        if path.stat().st_size < len(MAGIC):
            raise NotGGUF(f"{path}: not a GGUF file ({path.stat().st_size} bytes); --gguf-file names a .gguf file "
                          "inside --hf-model")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:  # the header only is read
            reader = _Reader(path, data)
            values, tensors = _walk(reader)
            check_extent(reader, values, tensors)
            check_blocks(path, values, tensors)
            return GGUFSummary(len(tensors), sum(t.elements for t in tensors))


def _walk(r: _Reader) -> tuple[dict, list[_Tensor]]:
    """The header's scalar and string values by key, and its tensors."""
    path = r.path
    if r.take(min(4, len(r.data)), "the magic") != MAGIC:
        raise NotGGUF(f"{path}: not a GGUF file (it does not start with {MAGIC!r}); --gguf-file names a .gguf file "
                      "inside --hf-model")
    version = r.scalar("<I", "the version")
    if version not in VERSIONS:
        raise NotGGUF(f"{path}: GGUF version {version}; versions {VERSIONS} are read")
    n_tensors = r.count("the tensor count", 8 + 4 + 8 + 4 + 8)  # a name's length, n_dims, a dim, type, offset
    values = {}
    for i in range(r.count("the key/value count", 8 + 4)):
        key = r.string(f"key {i}")
        values[key] = r.value(r.scalar("<I", f"the type of {key!r}"), repr(key))
    tensors = []
    for i in range(n_tensors):
        name = r.string(f"the name of tensor {i}")
        dims = r.scalar("<I", f"the dimensions of {name!r}")
        if not 1 <= dims <= MAX_DIMS:
            raise NotGGUF(f"{path}: tensor {name!r} has {dims} dimensions (GGUF has 1 to {MAX_DIMS}; a damaged or "
                          "crafted file); download it again")
        elements = math.prod(r.scalar("<Q", f"dimension {d} of {name!r}") for d in range(dims))
        kind = r.scalar("<I", f"the type of {name!r}")
        tensors.append(_Tensor(name, elements, kind, r.scalar("<Q", f"the offset of {name!r}")))
    return values, tensors


def check_extent(r: _Reader, values: dict, tensors: list[_Tensor]) -> None:
    """Every tensor's data inside the file: from the aligned end of the header, its offset plus its bytes."""
    alignment = values.get("general.alignment")
    alignment = alignment if isinstance(alignment, int) and alignment > 0 else ALIGNMENT
    start = -(-r.at // alignment) * alignment
    for t in tensors:
        per_block, block_bytes = TYPE_BYTES.get(t.kind, (1, 0))
        end = start + t.offset + -(-t.elements // per_block) * block_bytes
        if end > len(r.data) or start + t.offset > len(r.data):
            raise NotGGUF(f"{r.path}: tensor {t.name!r} runs past the end of the file (its data ends at byte {end}, "
                          f"the file has {len(r.data)}: cut short?); download it again")


def check_blocks(path: Path, values: dict, tensors: list[_Tensor]) -> None:
    """The block count the header claims, at most the blocks its tensors are of (`blk.N.`)."""
    key = f"{values.get('general.architecture')}.block_count"
    claimed = values.get(key)
    held = 1 + max((int(m.group(1)) for t in tensors if (m := BLOCK.match(t.name))), default=-1)
    if isinstance(claimed, int) and claimed > held:
        raise NotGGUF(f"{path}: {key} {claimed}, but the file holds tensors of {held} block(s) (a damaged or crafted "
                      "GGUF file); download it again")


def check_gguf(folder: str | Path, name: str) -> tuple[Path, GGUFSummary | None]:
    """FOLDER/NAME when it is a regular GGUF file inside FOLDER whose header fits the file, and what its header
    holds; else one line. A name inside the folder that is not there is left to the caller (summary None)."""
    folder, path = Path(folder), Path(folder) / name
    if Path(name).is_absolute() or not inside(path, folder):
        raise NotGGUF(f"--gguf-file {name}: not a file inside --hf-model {folder}; name a .gguf file in that folder "
                      "(e.g. --gguf-file model.Q4_K_M.gguf)")
    if path.exists() or path.is_symlink():
        return path, walk(regular(path, "--gguf-file"))
    return path, None
