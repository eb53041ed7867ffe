"""One tokenizer interface for training and evaluation.

Wraps a `tokenizers` JSON file (byte-level BPE trained by `evalm train tokenizer`, or GPT-2's), a
SentencePiece `.model`, or raw bytes (`ByteTokenizer`, no file, for tests and synthetic tasks).
Every tokenizer has an end-of-document id (`eos_id`), written between documents (OPT's
`</s>` after each document, docs/training.md) and usable as the ICL separator.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from evalm.config_toolkit import InputError, MissingExtra, MissingInput


class Tokenizer(Protocol):
    vocab_size: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: list[str]) -> list[list[int]]: ...

    def decode(self, ids: list[int]) -> str: ...


class HFTokenizer:
    """A `tokenizers.Tokenizer` loaded from `tokenizer.json`; eos is `</s>` (or `<|endoftext|>`)."""

    EOS_NAMES = ("</s>", "<|endoftext|>", "<eos>")

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer as _Tok

        self.path = Path(path)
        self._tok = _Tok.from_file(str(self.path))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        ids = [self._tok.token_to_id(name) for name in self.EOS_NAMES]
        found = [i for i in ids if i is not None]
        if not found:
            raise InputError(f"{self.path}: no end-of-document token among {self.EOS_NAMES}")
        self.eos_id = found[0]

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)


class SentencePieceTokenizer:
    """A SentencePiece `.model` (optional extra `sentencepiece`)."""

    def __init__(self, path: str | Path):
        try:
            import sentencepiece as spm
        except ImportError as err:  # optional dependency: fail with what to do
            raise MissingExtra("loading a .model needs: pip install 'evalm[sentencepiece]'") from err
        self.path = Path(path)
        self._sp = spm.SentencePieceProcessor(model_file=str(self.path))
        self.vocab_size = self._sp.get_piece_size()
        self.eos_id = self._sp.eos_id()
        if self.eos_id < 0:
            raise InputError(f"{self.path}: the SentencePiece model has no eos piece")

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self._sp.encode(texts)

    def decode(self, ids: list[int]) -> str:
        return self._sp.decode(list(ids))


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255 and eos = 256: needs no file, never fails on any text."""

    vocab_size = 257
    eos_id = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def load_tokenizer(path: str | Path | None) -> Tokenizer:
    """`tokenizer.json` (or a folder holding one), a `.model` file, or None/"bytes" for bytes."""
    if path is None or str(path) == "bytes":
        return ByteTokenizer()
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise MissingInput(f"{path}: tokenizer not found (train one with `evalm train tokenizer`)")
    if path.suffix == ".model":
        return SentencePieceTokenizer(path)
    return HFTokenizer(path)
