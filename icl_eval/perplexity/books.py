"""Books for perplexity vs length (docs/evaluation.md; EVALM §4.4, PG-19), one at a time.

`--books` names any mix of:
- a folder of `.txt` books (PG-19's `train/`, `validation/`, `test/` as distributed), or one `.txt`;
- a `.jsonl` / `.json` / `.parquet` / `.csv` file with a `text` column, one book per row;
- a `save_to_disk` folder, or a dataset id with a split from the offline `datasets` cache
  (`deepmind/pg19:test`: columns `short_book_title`, `text`, one book per row).

A book must be text: a file with NUL bytes or more than a trace of invalid UTF-8 (an ELF binary,
random bytes) is refused with its name, never scored through replacement characters.

Books are yielded lazily: files are streamed and Arrow data is memory-mapped, so memory holds one
book at a time whatever the number of books (PG-19's train split is 28,602 books, 11 GB).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path

from evalm.text.data_source import DataSourceError, is_saved_dataset, iter_rows
from evalm.storage import read_text

TITLE_COLUMNS = ("short_book_title", "title", "book_title", "id")
"""Columns naming a book, first present wins (PG-19 calls it `short_book_title`)."""


def iter_books(sources: Iterable[str | Path], max_books: int | None = None) -> Iterator[tuple[str, str]]:
    """(name, text) of each book, in order, stopping after `max_books` without reading further."""
    sources = [str(s) for s in sources]
    books = (book for source in sources for book in _books_of(source))
    count = 0
    for count, book in enumerate(islice(books, max_books) if max_books else books, 1):
        yield book
    if not count:
        raise DataSourceError(f"no books in {sources}")


def _books_of(source: str) -> Iterator[tuple[str, str]]:
    path = Path(source)
    if path.is_dir() and not is_saved_dataset(path):
        files = sorted(path.glob("*.txt"))
        if not files:
            raise DataSourceError(f"{path}: no books here; --books expects a folder of .txt files, one book each "
                                  "(PG-19's test/ as distributed), a .txt file, a jsonl/parquet file with a `text` "
                                  "column, or a cached id such as deepmind/pg19:test")
        for f in files:
            yield f.name, read_text(f, "book")
    elif path.suffix == ".txt":
        if not path.is_file():
            raise DataSourceError(f"{path}: no such book")
        yield path.name, read_text(path, "book")
    else:
        yield from _dataset_books(source)


def _dataset_books(source: str) -> Iterator[tuple[str, str]]:
    """One book per row of a data file, saved folder or cached `id[/config]:split`."""
    title = None
    for i, row in enumerate(iter_rows(source)):
        if i == 0:
            if "text" not in row:
                raise DataSourceError(f"{source}: rows need a `text` column; it has {sorted(row)}")
            title = next((c for c in TITLE_COLUMNS if c in row), None)
        yield (f"{row[title]}" if title else f"{source}:{i}"), row["text"]
