"""Data files read line by line, with bounds: zstd frames checked to their end, lines of bounded length.

A `.jsonl.zst` of 32 KB can expand to one line of 1 GiB (zstd compresses a repeated byte about
30,000 to 1). A reader that gathers a line before looking at it then holds the whole line, a
decoded copy and a parsed copy: several GiB from a file that looked small, and a crash under any
memory cap. `lines` therefore never holds more than `max_bytes` of one line: a longer line is
skipped to its end without being kept and handed over as a `LongLine` (its first bytes and its
length), so the reader can report it with its file and line and go on with the next one.

Both readers of document files use this: the data pipeline's (`data_pipeline/reader.py`, which
records the line as a bad record) and the tokenizer's (`train/tokenizer.py`, which refuses it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

MAX_LINE_BYTES = 256 << 20
"""The longest line a document file may hold: 256 MiB, far above any real document (the longest
are whole books, megabytes each), so only a broken or hostile file reaches it, and a line at the
limit still fits in memory the few times a reader copies it."""

HEAD_BYTES = 2000
"""Bytes of a too-long line kept to show in its error (enough to recognise it)."""


@dataclass(frozen=True)
class LongLine:
    """A line longer than the limit, not kept: its first bytes and its whole length."""

    head: bytes
    length: int


def zstd_blocks(raw: BinaryIO, chunk: int = 1 << 20) -> Iterator[bytes]:
    """Decompressed blocks of a (multi-frame) zstd stream; EOFError if it ends inside a frame.

    zstandard's stream_reader (what fsspec uses) returns a short read at a truncated end without
    any error, which would lose the rest of the file silently."""
    import zstandard

    dobj, fed = zstandard.ZstdDecompressor().decompressobj(), False
    while block := raw.read(chunk):
        while block:
            out = dobj.decompress(block)
            fed = True
            if out:
                yield out
            if dobj.eof:  # frame complete; anything left starts the next frame
                block = dobj.unused_data
                dobj, fed = zstandard.ZstdDecompressor().decompressobj(), False
            else:
                block = b""
    if fed:
        raise EOFError("zstd stream ends inside a frame (truncated file)")


def lines(blocks: Iterable[bytes], max_bytes: int = MAX_LINE_BYTES) -> Iterator[bytes | LongLine]:
    """The lines of a stream of byte blocks, without their newline; a line of more than `max_bytes`
    bytes is a `LongLine`, read to its end but never held."""
    parts: list[bytes] = []
    size, head = 0, None
    for block in blocks:
        pieces = block.split(b"\n")
        for i, piece in enumerate(pieces):
            size += len(piece)
            if head is None and size > max_bytes:
                head, parts = b"".join([*parts, piece])[:HEAD_BYTES], []
            elif head is None:
                parts.append(piece)
            if i < len(pieces) - 1:  # a newline ends this line
                yield LongLine(head, size) if head is not None else b"".join(parts)
                parts, size, head = [], 0, None
    if size:
        yield LongLine(head, size) if head is not None else b"".join(parts)
