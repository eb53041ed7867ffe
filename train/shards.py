"""Token shards: flat arrays of token ids with a document index.

A shard folder holds, per shard `shard-00000`:
    shard-00000.bin      the token ids of many documents back to back, each followed by the
                         end-of-document id (docs/training.md: `</s>` after each document);
                         uint16 when the vocabulary fits in 65536 ids, else uint32
    shard-00000.idx.npy  int64 (D, 3): start offset, length (end-of-document included), subset tag
and one `manifest.json`, written last, so a folder without it is incomplete (nanochat's "manifest
written last"). The manifest names the dtype, the tokenizer, the eos id and the subset names that
the tags index.

Training reads the shards as one stream and cuts fixed lines of seq_len + 1 tokens that overlap by
one token, so every token but the first is a target exactly once per epoch.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from evalm.config_toolkit import InputError, MissingInput
from evalm.storage import read_json, replaced, write_atomic

FORMAT = "evalm-token-shards/1"
MANIFEST = "manifest.json"


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


class ShardWriter:
    """Appends documents to shards of about `tokens_per_shard` tokens; `close()` writes the manifest."""

    def __init__(self, out_dir: str | Path, *, vocab_size: int, eos_id: int, tokenizer: str,
                 tokens_per_shard: int = 100_000_000):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / MANIFEST).unlink(missing_ok=True)  # the folder is incomplete until close()
        self.dtype = token_dtype(vocab_size)
        self.meta = {"format": FORMAT, "dtype": self.dtype.name, "vocab_size": vocab_size,
                     "eos_id": eos_id, "tokenizer": tokenizer}
        self.tokens_per_shard = tokens_per_shard
        self.subsets: dict[str, int] = {}
        self.shards: list[dict[str, Any]] = []
        self._tokens: list[np.ndarray] = []
        self._index: list[tuple[int, int, int]] = []
        self._size = 0

    def add(self, ids: list[int], subset: str) -> None:
        """One document: its ids, then the end-of-document id."""
        tag = self.subsets.setdefault(subset, len(self.subsets))
        doc = np.asarray([*ids, self.meta["eos_id"]], dtype=self.dtype)
        self._index.append((self._size, len(doc), tag))
        self._tokens.append(doc)
        self._size += len(doc)
        if self._size >= self.tokens_per_shard:
            self._flush()

    def _flush(self) -> None:
        if not self._index:
            return
        name = f"shard-{len(self.shards):05d}"
        tokens = np.concatenate(self._tokens)
        with replaced(self.out_dir / f"{name}.bin") as tmp:  # whole, never through a link
            tokens.tofile(tmp)
        with replaced(self.out_dir / f"{name}.idx.npy") as tmp, open(tmp, "wb") as f:
            np.save(f, np.asarray(self._index, dtype=np.int64))
        # the content's hash makes the manifest, and so a run's data identity, change with the tokens
        self.shards.append({"name": name, "tokens": self._size, "documents": len(self._index),
                            "sha256": hashlib.sha256(tokens.tobytes()).hexdigest()})
        self._tokens, self._index, self._size = [], [], 0

    def close(self) -> dict[str, Any]:
        """Flush the last shard and write the manifest (the completion marker)."""
        self._flush()
        manifest = {**self.meta, "subsets": list(self.subsets), "shards": self.shards,
                    "tokens": sum(s["tokens"] for s in self.shards),
                    "documents": sum(s["documents"] for s in self.shards)}
        write_atomic(self.out_dir / MANIFEST, json.dumps(manifest, indent=2))
        return manifest


class TokenShards:
    """All shards of a folder as one read-only token stream (memory-mapped)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        path = self.folder / MANIFEST
        if not path.is_file():
            raise MissingInput(
                f"{path}: no manifest, so {self.folder} is not a complete token-shard folder; "
                "write one with `evalm train tokenizer --input DOCS --output DIR`")
        self.manifest = read_json(path)
        if self.manifest.get("format") != FORMAT:
            raise InputError(f"{path}: format {self.manifest.get('format')!r}, expected {FORMAT!r}")
        dtype = np.dtype(self.manifest["dtype"])
        self.arrays = [np.memmap(self.folder / f"{s['name']}.bin", dtype=dtype, mode="r")
                       for s in self.manifest["shards"]]
        sizes = [len(a) for a in self.arrays]
        self.starts = np.cumsum([0, *sizes])  # (S+1,) offset of each shard in the stream
        self.eos_id: int = self.manifest["eos_id"]
        self.vocab_size: int = self.manifest["vocab_size"]

    def __len__(self) -> int:
        return int(self.starts[-1])

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens [start, start + length) of the stream, across shard boundaries, as int64."""
        out = np.empty(length, dtype=np.int64)
        shard = int(np.searchsorted(self.starts, start, side="right")) - 1
        filled = 0
        while filled < length:
            offset = start + filled - int(self.starts[shard])
            piece = self.arrays[shard][offset: offset + length - filled]
            out[filled: filled + len(piece)] = piece
            filled += len(piece)
            shard += 1
        return out

    def documents(self, shard: int) -> np.ndarray:
        """The (D, 3) index of one shard: start, length, subset tag."""
        return np.load(self.folder / f"{self.manifest['shards'][shard]['name']}.idx.npy")


class PretrainLines:
    """Fixed lines of seq_len + 1 tokens cut from the stream; line i starts at token i * seq_len."""

    def __init__(self, shards: TokenShards, seq_len: int):
        self.shards, self.seq_len = shards, seq_len
        self.n_lines = (len(shards) - 1) // seq_len
        if self.n_lines < 1:
            raise InputError(
                f"{shards.folder}: {len(shards)} tokens cannot fill one line of {seq_len}+1 tokens; "
                "use more documents or a smaller data.seq_len")

    def __len__(self) -> int:
        return self.n_lines

    def line(self, i: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Tokens (seq_len + 1,) and no loss mask (every target counts in pretraining)."""
        return self.shards.read(i * self.seq_len, self.seq_len + 1), None
