"""Books for perplexity vs length (docs/evaluation.md; EVALM §4.4, PG-19), one at a time.

`--books` names any mix of:
- a folder of `.txt` books (PG-19's `train/`, `validation/`, `test/` as distributed), or one `.txt`;
- a `.jsonl` / `.json` / `.parquet` / `.csv` file with a `text` column, one book per row;
- a `save_to_disk` folder, or a dataset id with a split from the offline `datasets` cache
  (`deepmind/pg19:test`: columns `short_book_title`, `text`, one book per row).

A book must be text: a file with NUL bytes or more than a trace of invalid UTF-8 (an ELF binary,
random bytes), or a data row whose `text` is not a string or holds NUL bytes, is refused with its
name, never scored through replacement characters. Every file must be a regular file (a FIFO or a
link to `/dev/zero` is refused, not read forever), and a file named twice is scored once.

Books are yielded lazily: files are streamed and Arrow data is memory-mapped, so memory holds one
book at a time whatever the number of books (PG-19's train split is 28,602 books, 11 GB).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from pathlib import Path

from evalm.config_toolkit import InputError
from evalm.text.data_source import DataSourceError, is_saved_dataset, iter_rows
from evalm.storage import read_text
from evalm.storage.files import regular as regular_file

TITLE_COLUMNS = ("short_book_title", "title", "book_title", "id")
"""Columns naming a book, first present wins (PG-19 calls it `short_book_title`)."""

Note = Callable[[str], None] | None


def iter_books(sources: Iterable[str | Path], max_books: int | None = None, note: Note = None) -> Iterator[tuple[str, str]]:
    """(name, text) of each book, in order, stopping after `max_books` without reading further.

    A file named twice (`--books dir dir/a.txt ./dir/a.txt`, or through a link) is one book: files
    and data sources are taken once by their resolved real path, and `note` hears of each repeat."""
    sources = [str(s) for s in sources]
    seen: dict[str, str] = {}  # real path -> the name it was first read under
    books = (book for source in sources for book in _books_of(source, seen, note))
    count = 0
    for count, book in enumerate(islice(books, max_books) if max_books else books, 1):
        yield book
    if not count:
        raise DataSourceError(f"no books in {sources}")


def _books_of(source: str, seen: dict[str, str], note: Note) -> Iterator[tuple[str, str]]:
    path = Path(source)
    if path.is_dir() and not is_saved_dataset(path):
        files = sorted(path.glob("*.txt"))
        if not files:
            raise DataSourceError(f"{path}: no books here; --books expects a folder of .txt files, one book each "
                                  "(PG-19's test/ as distributed), a .txt file, a jsonl/parquet file with a `text` "
                                  "column, or a cached id such as deepmind/pg19:test")
        for f in files:
            if _first(regular(f), seen, note):
                yield f.name, read_text(f, "book")
    elif path.suffix == ".txt":
        if not path.exists() and not path.is_symlink():
            raise DataSourceError(f"{path}: no such book")
        if _first(regular(path), seen, note):
            yield path.name, read_text(path, "book")
    elif not (path.exists() or path.is_symlink()):  # a cached dataset id, e.g. deepmind/pg19:test
        if _first_id(source, seen, note):
            yield from _dataset_books(source)
    elif _first(path if is_saved_dataset(path) else regular(path), seen, note):
        yield from _dataset_books(source)


def regular(path: Path) -> Path:
    """`path` when it is (or links to) a regular file (`storage.files.regular`: a FIFO would block the
    read forever, `/dev/zero` never ends, a loop of links names nothing); a dangling link is named."""
    try:
        return regular_file(path, "--books")
    except FileNotFoundError:
        raise DataSourceError(f"{path}: no such book (a link to a file that is gone?)") from None


def _first(path: Path, seen: dict[str, str], note: Note) -> bool:
    """True the first time a file (by its real path) is met; later names of it are skipped, and said."""
    return _first_id(os.path.realpath(path), seen, note, str(path))


def _first_id(key: str, seen: dict[str, str], note: Note, name: str | None = None) -> bool:
    name = name or key
    if key in seen:
        if note is not None:
            note(f"--books: {name} is {seen[key]} again (the same file); scored once")
        return False
    seen[key] = name
    return True


def _dataset_books(source: str) -> Iterator[tuple[str, str]]:
    """One book per row of a data file, saved folder or cached `id[/config]:split`; a row's `text` must be
    a string without NUL bytes (the rule of a .txt book: binary data is not a book)."""
    title = None
    for i, row in enumerate(iter_rows(source, rows_at_once=1)):
        if i == 0:
            if "text" not in row:
                raise DataSourceError(f"{source}: rows need a `text` column; it has {sorted(row)}")
            title = next((c for c in TITLE_COLUMNS if c in row), None)
        text = row["text"]
        if not isinstance(text, str):
            raise InputError(f"{source}: row {i}: `text` is {type(text).__name__} {text!r:.40}, not a string; "
                             "a book is text")
        if "\x00" in text:
            raise InputError(f"{source}: row {i}: not a book (NUL bytes at offset {text.index(chr(0))}: binary "
                             "data?); remove it from the input")
        yield (f"{row[title]}" if title else f"{source}:{i}"), text
