"""Helpers for the data pipeline tests: real Pile-format shards written into tmp_path."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest
import zstandard


def pile_line(text: str, subset: str, **extra) -> bytes:
    return orjson.dumps({"text": text, "meta": {"pile_set_name": subset}, **extra})


def write_shard(path: Path, lines: list[bytes]) -> Path:
    data = b"".join(line + b"\n" for line in lines)
    if path.name.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    elif path.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)
    return path


def read_records(folder: Path) -> list[dict]:
    """Every record of every .jsonl[.zst|.gz] file in a folder, in file order."""
    out = []
    for path in sorted(folder.glob("*.jsonl*")):
        raw = path.read_bytes()
        if path.name.endswith(".zst"):
            raw = zstandard.ZstdDecompressor().decompressobj().decompress(raw)
        elif path.name.endswith(".gz"):
            raw = gzip.decompress(raw)
        out.extend(orjson.loads(line) for line in raw.splitlines() if line.strip())
    return out


@pytest.fixture
def run_cli():
    from evalm.data_pipeline.cli import main

    def run(*argv: str) -> int:
        return main([str(a) for a in argv])

    return run
