"""Pile-format reader on datatrove's `BaseDiskReader` that never drops a bad record silently.

datatrove's own JsonlReader logs and skips an invalid line; the issue asks that every bad
record be counted and written, with file and line, to the task's errors file. So `read_file`
is ours; the folder handling, fsspec, compression (zstd/gzip by extension) and the file-to-task
sharding (`paths_file`, file i goes to task i mod N) are datatrove's.

Bad input kinds: `invalid_json`, `not_an_object`, `missing_text`, `undecodable_bytes`,
`line_too_long` (more than `storage.streams.MAX_LINE_BYTES`: skipped without being held, so a small
`.zst` that expands to a 1 GiB line costs no memory), `truncated_file` (a compressed stream that ends
early or is corrupt), `unreadable_file`.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import orjson
import zstandard
from datatrove.pipeline.readers.base import BaseDiskReader

from evalm.data_pipeline.document import Document, from_record
from evalm.storage.streams import MAX_LINE_BYTES, LongLine, lines, zstd_blocks

_EXCERPT = 2000  # bytes of a bad line kept in the errors file (base64), enough to find it again


def _extension(path: str) -> str:
    name = path.lower()
    for ext in (".jsonl.zst", ".jsonl.zstd", ".jsonl.gz", ".jsonl", ".parquet"):
        if name.endswith(ext):
            return ext
    return ""


def is_data_file(path: str) -> bool:
    return _extension(path) != ""


class PileReader(BaseDiskReader):
    """Reads jsonl / jsonl.zst / jsonl.gz / parquet rows with `text` and `meta.pile_set_name`."""

    name = "Pile reader (errors recorded)"

    def __init__(self, data_folder: str, paths_file: str):
        super().__init__(data_folder, paths_file=paths_file, add_file_path=False)
        self.errors: list[dict[str, Any]] = []
        self.records = 0  # good + bad, the denominator of the error fraction

    def _error(self, path: str, line: int, kind: str, message: str, raw: bytes | LongLine | None = None) -> None:
        self.records += 1
        entry = {"file": path, "line": line, "kind": kind, "message": message}
        if raw is not None:
            head = raw.head if isinstance(raw, LongLine) else raw
            entry["raw_base64"] = base64.b64encode(head[:_EXCERPT]).decode("ascii")
            entry["raw_bytes"] = raw.length if isinstance(raw, LongLine) else len(raw)
        self.errors.append(entry)

    def _document(self, path: str, line: int, record: Any, raw: bytes | None) -> Document | None:
        if not isinstance(record, dict):
            self._error(path, line, "not_an_object", f"expected a JSON object, got {type(record).__name__}", raw)
            return None
        if not isinstance(record.get("text"), str):
            self._error(path, line, "missing_text", f"no string `text` field (keys: {sorted(record)[:10]})", raw)
            return None
        self.records += 1
        return from_record(record, default_id=f"{path}:{line}")

    def read_file(self, filepath: str) -> Iterator[Document]:
        if _extension(filepath) == ".parquet":
            yield from self._read_parquet(filepath)
        else:
            yield from self._read_jsonl(filepath)

    def _read_jsonl(self, filepath: str) -> Iterator[Document]:
        line = 0
        try:
            zstd = _extension(filepath).endswith((".zst", ".zstd"))
            with self.data_folder.open(filepath, "rb", compression=None if zstd else "infer") as f:
                blocks = zstd_blocks(f) if zstd else iter(lambda: f.read(1 << 20), b"")
                for line, raw in enumerate(lines(blocks), start=1):
                    if isinstance(raw, LongLine):
                        self._error(filepath, line, "line_too_long", f"a line of {raw.length} bytes, more than "
                                    f"the {MAX_LINE_BYTES} a document may hold; not read", raw)
                        continue
                    if not raw.strip():
                        continue
                    try:
                        text = raw.decode("utf-8")
                    except UnicodeDecodeError as err:
                        self._error(filepath, line, "undecodable_bytes", f"not UTF-8: {err}", raw)
                        continue
                    try:
                        record = orjson.loads(text)
                    except orjson.JSONDecodeError as err:
                        self._error(filepath, line, "invalid_json", str(err), raw)
                        continue
                    doc = self._document(filepath, line, record, raw)
                    if doc is not None:
                        yield doc
        except (EOFError, OSError, ValueError, zstandard.ZstdError) as err:
            # gzip raises EOFError/BadGzipFile (OSError), zstandard ZstdError: the file ends early
            self._error(filepath, line + 1, "truncated_file", f"stream ended or is corrupt after line {line}: {err}")

    def _read_parquet(self, filepath: str) -> Iterator[Document]:
        import pyarrow.parquet as pq

        row = 0
        try:
            with self.data_folder.open(filepath, "rb") as f:
                for batch in pq.ParquetFile(f).iter_batches(batch_size=1024):
                    for record in batch.to_pylist():
                        row += 1
                        doc = self._document(filepath, row, record, None)
                        if doc is not None:
                            yield doc
        except Exception as err:  # noqa: BLE001 - pyarrow raises many types for a corrupt file
            self._error(filepath, row + 1, "unreadable_file", f"parquet read failed after row {row}: {err}")
