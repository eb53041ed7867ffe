"""Books for perplexity vs length: PG-19 from a hub-layout `datasets` cache, files, folders; lazily.

Run: python -m pytest tests/icl_eval/test_books.py -q
"""

from __future__ import annotations

import json
import tracemalloc

import datasets
import pytest
import torch

from evalm import EvalmModel, ModelConfig
from evalm.text.data_source import DataSourceError
from evalm.io import save_model
from evalm.icl_eval.perplexity.books import iter_books
from tests.hub_cache import write_hub_cache


def pg19(n: int, chars: int = 40) -> dict[str, list]:
    """PG-19's columns (deepmind/pg19): short_book_title, publication_date, url, text."""
    return {"short_book_title": [f"Book {i}" for i in range(n)], "publication_date": [1900 + i for i in range(n)],
            "url": [f"http://www.gutenberg.org/ebooks/{i}" for i in range(n)],
            "text": [(f"book {i} " * chars)[:chars] for i in range(n)]}


def test_pg19_split_from_the_cache_title_and_text(tmp_path):
    write_hub_cache(tmp_path, "deepmind/pg19", None, {"test": pg19(3), "validation": pg19(1)})
    books = list(iter_books(["deepmind/pg19:test"]))
    assert books == [(f"Book {i}", pg19(3)["text"][i]) for i in range(3)]
    assert list(iter_books(["deepmind/pg19:test"], max_books=2)) == books[:2]
    with pytest.raises(DataSourceError, match=r"several splits \['test', 'validation'\]; name one: `deepmind/pg19:SPLIT`"):
        list(iter_books(["deepmind/pg19"]))
    with pytest.raises(DataSourceError, match=r"'datasets<4'.*load_dataset\('deepmind/pg19', trust_remote_code=True\)"):
        list(iter_books(["deepmind/pg19:train"]))


def test_txt_folder_jsonl_parquet_and_saved_folder(tmp_path):
    (tmp_path / "txt").mkdir()
    (tmp_path / "txt" / "b.txt").write_text("second")
    (tmp_path / "txt" / "a.txt").write_text("first")
    rows = datasets.Dataset.from_dict({"title": ["X", "Y"], "text": ["x text", "y text"]})
    rows.to_json(str(tmp_path / "books.jsonl"))
    rows.to_parquet(str(tmp_path / "books.parquet"))
    rows.save_to_disk(str(tmp_path / "saved"))
    expected = [("a.txt", "first"), ("b.txt", "second")] + [("X", "x text"), ("Y", "y text")] * 3
    sources = [tmp_path / "txt", tmp_path / "books.jsonl", tmp_path / "books.parquet", tmp_path / "saved"]
    assert list(iter_books(sources)) == expected
    datasets.Dataset.from_dict({"body": ["no text column"]}).to_parquet(str(tmp_path / "bad.parquet"))
    with pytest.raises(DataSourceError, match=r"bad.parquet: rows need a `text` column; it has \['body'\]"):
        list(iter_books([tmp_path / "bad.parquet"]))
    datasets.Dataset.from_dict({"text": []}).to_parquet(str(tmp_path / "empty.parquet"))
    with pytest.raises(DataSourceError, match="no books"):
        list(iter_books([tmp_path / "empty.parquet"]))


def test_sources_are_opened_only_when_reached(tmp_path):
    """max_books stops before a later source is even opened (it is missing from the cache here)."""
    write_hub_cache(tmp_path, "deepmind/pg19", None, {"test": pg19(2)})
    assert len(list(iter_books(["deepmind/pg19:test", "not/cached:test"], max_books=2))) == 2
    with pytest.raises(DataSourceError, match="not/cached"):
        list(iter_books(["deepmind/pg19:test", "not/cached:test"], max_books=3))


def _peak_python_bytes(read) -> int:
    """Peak Python allocation while `read()`'s books are consumed one by one."""
    tracemalloc.start()
    for _name, text in read():
        del text
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def test_memory_stays_flat_in_the_number_of_books(tmp_path):
    """Reading 240 books of 64 kB peaks near reading 30: one book (or one small batch) is held at a time."""
    book = 64_000
    # laid out as datasets<4 leaves PG-19's loading script output: version 0.1.0, sharded Arrow files
    folder = write_hub_cache(tmp_path, "deepmind/pg19", None, {"test": pg19(30, book), "train": pg19(240, book)},
                             version="0.1.0", max_shard_size=4 * 2**20)
    assert len(list(folder.glob("pg19-train-*-of-*.arrow"))) > 1
    few = _peak_python_bytes(lambda: iter_books(["deepmind/pg19:test"]))
    many = _peak_python_bytes(lambda: iter_books(["deepmind/pg19:train"]))
    eager = _peak_python_bytes(lambda: list(iter_books(["deepmind/pg19:train"])))  # the oracle: materialised
    assert eager > 240 * book * 0.9, eager  # the measure sees whole-split materialisation
    assert many < 1.5 * few + book and many < eager / 8, (few, many, eager)


def test_cli_ppl_reads_pg19_from_the_cache(tmp_path):
    from evalm.icl_eval.cli import main

    write_hub_cache(tmp_path, "deepmind/pg19", None, {"test": pg19(3, 120)})
    torch.manual_seed(0)
    model = EvalmModel(ModelConfig(vocab_size=257, d_model=16, n_layer=1, n_head=2, d_ff=32, window_size=8,
                                   chunk_size=4, circular_period=1024, dropout=0.0, attn_dropout=0.0))
    model.init_weights()
    ckpt = save_model(model, tmp_path / "ckpt")
    out = tmp_path / "ppl"
    assert main(["ppl", "--checkpoint", str(ckpt), "--books", "deepmind/pg19:test", "--lengths", "64,120",
                 "--ppl.segment_tokens=64", "--ppl.max_books=2", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert [b["book"] for b in res["books"]] == ["Book 0", "Book 1"] and res["books"][0]["tokens"] == 120
