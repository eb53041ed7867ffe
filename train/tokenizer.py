"""`evalm train tokenizer`: train a byte-level BPE (or load one), then encode documents to shards.

Documents are the data pipeline's output (`evalm data blend` writes
OUT/documents/<rank>.jsonl.zst): jsonl, jsonl.gz, jsonl.zst or parquet with `text` and
`metadata.pile_set_name` (or raw Pile's `meta.pile_set_name`) as the subset tag. The tokenizer is
GPT-2 style byte-level BPE trained with `tokenizers` (docs/training.md: OPT uses GPT-2's byte-level
BPE), with `</s>` as the end-of-document token written after every document, or an existing
`tokenizer.json` / SentencePiece `.model` given with `--tokenizer`.
"""

from __future__ import annotations

import gzip
import json
import sys
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import zstandard

from evalm.config_toolkit import InputError, MissingInput, Parser
from evalm.storage import RunFolder, replaced
from evalm.storage.streams import MAX_LINE_BYTES, LongLine, lines, zstd_blocks
from evalm.text.tokenizer import load_tokenizer
from evalm.train.shards import ShardWriter

SPECIAL_TOKENS = ["</s>", "<pad>"]  # eos first: id 0 (docs/training.md `</s>` after each document)
SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet")
# Folders of a data-pipeline output that hold dropped documents, never training text.
SKIPPED_FOLDERS = {"rejected", "rejects", "removed", "duplicates", "errors", "stats", "done"}


def document_files(folder: str | Path) -> list[Path]:
    """Document files under `folder` (sorted, so encoding order is reproducible)."""
    folder = Path(folder)
    if folder.is_file():
        return [folder]
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES)
                   and not SKIPPED_FOLDERS & set(p.relative_to(folder).parts[:-1]))
    if not files:
        raise MissingInput(f"{folder}: no document files ({', '.join(SUFFIXES)}) found")
    return files


def _jsonl_lines(path: Path) -> Iterator[str]:
    """The lines of a jsonl file (plain, .gz or .zst) as text; a line longer than MAX_LINE_BYTES, one
    that is not UTF-8 and a compressed stream cut short are errors naming the file and line."""
    number = 0
    try:
        with (gzip.open(path, "rb") if path.name.endswith(".gz") else path.open("rb")) as f:
            blocks = zstd_blocks(f) if path.name.endswith(".zst") else iter(lambda: f.read(1 << 20), b"")
            for number, raw in enumerate(lines(blocks), 1):
                if isinstance(raw, LongLine):
                    raise InputError(f"{path}:{number}: a line of {raw.length} bytes, more than the {MAX_LINE_BYTES} "
                                     "a document may hold (a broken or hostile file?); remove it from the input")
                yield raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{path}:{number}: not UTF-8 text ({err.reason} at byte {err.start} of the line); "
                         "convert the file to UTF-8 or remove it from the input") from None
    except (EOFError, gzip.BadGzipFile, zlib.error, zstandard.ZstdError) as err:
        raise InputError(f"{path}: the compressed stream ends early or is corrupt after line {number} ({err}); "
                         "restore the file or remove it from the input") from None


def subset_of(record: dict) -> str:
    """Our outputs keep the subset in `metadata.pile_set_name`, raw Pile shards in `meta`."""
    for key in ("metadata", "meta"):
        meta = record.get(key)
        if isinstance(meta, dict) and isinstance(meta.get("pile_set_name"), str):
            return meta["pile_set_name"]
    return "unknown"


def read_documents(files: Sequence[Path]) -> Iterator[tuple[str, str]]:
    """(text, subset) of every document; a line that is not a JSON document is an error with its place."""
    for path in files:
        if path.name.endswith(".parquet"):
            import pyarrow.parquet as pq

            for row in pq.read_table(path).to_pylist():
                yield row["text"], subset_of(row)
            continue
        for number, line in enumerate(_jsonl_lines(path), 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                text = doc["text"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise InputError(f"{path}:{number}: not a JSON document with a 'text' field") from None
            yield text, subset_of(doc)


def train_bpe(texts: Iterator[str], vocab_size: int):
    """A byte-level BPE `tokenizers.Tokenizer`: no normaliser, so decode(encode(t)) == t."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def encode_to_shards(tokenizer, files: Sequence[Path], out_dir: Path, tokenizer_path: str,
                     tokens_per_shard: int, batch_docs: int = 256) -> dict:
    """Encode every document into shards with the end-of-document id after each."""
    writer = ShardWriter(out_dir, vocab_size=tokenizer.vocab_size, eos_id=tokenizer.eos_id,
                         tokenizer=tokenizer_path, tokens_per_shard=tokens_per_shard)
    batch: list[tuple[str, str]] = []

    def flush() -> None:
        for ids, (_, subset) in zip(tokenizer.encode_batch([t for t, _ in batch]), batch):
            writer.add(ids, subset)
        batch.clear()

    for doc in read_documents(files):
        batch.append(doc)
        if len(batch) >= batch_docs:
            flush()
    flush()
    return writer.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="evalm train tokenizer", description=__doc__.split("\n")[0])
    parser.add_argument("--input", required=True, metavar="PATH", help="folder (or file) of documents (required)")
    parser.add_argument("--output", required=True, metavar="DIR",
                        help="folder for tokenizer.json and the token shards (required)")
    parser.add_argument("--vocab-size", type=int, default=8192, metavar="N", help="BPE vocabulary size (default: 8192)")
    parser.add_argument("--tokenizer", default=None, metavar="PATH", help="use this tokenizer.json / SentencePiece "
                        ".model / `bytes` instead of training one (default: none, train a byte-level BPE)")
    parser.add_argument("--tokens-per-shard", type=int, default=100_000_000, metavar="N",
                        help="token ids per shard file; a new shard starts past it (default: 100000000)")
    args = parser.parse_args(argv)
    files = document_files(args.input)
    started = time.time()
    inputs = [args.input, None if args.tokenizer in (None, "bytes") else args.tokenizer]
    # a new or empty folder, or one this command made; never its input (storage.RunFolder)
    with RunFolder(args.output, "evalm train tokenizer", inputs=inputs).held() as folder:
        out = folder.path
        if args.tokenizer is None:
            path = out / "tokenizer.json"
            with replaced(path) as tmp:
                train_bpe((text for text, _ in read_documents(files)), args.vocab_size).save(str(tmp))
            print(f"trained byte-level BPE ({args.vocab_size} ids) on {len(files)} file(s) -> {path}")
        else:
            path = args.tokenizer
        tokenizer = load_tokenizer(path)
        manifest = encode_to_shards(tokenizer, files, out, str(path), args.tokens_per_shard)
    print(f"encoded {manifest['documents']} documents, {manifest['tokens']} tokens "
          f"({manifest['dtype']}, {len(manifest['shards'])} shard(s), subsets {manifest['subsets']}) "
          f"-> {out} in {time.time() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
