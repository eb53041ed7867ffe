"""Reading PG-19 from the `datasets` cache: peak memory vs the number of books.

Run: python benchmarks/books.py [--books 20,80,320] [--kib 400]

Writes `deepmind/pg19`-shaped splits (short_book_title, publication_date, url, text; books of
--kib KiB, PG-19's mean is about 400 KiB) into a temporary hub-layout cache, then, in a fresh
process per measurement, reads every book through `icl_eval.perplexity.books.iter_books` and prints the
peak anonymous resident memory (RssAnon, sampled after each book) above its value after imports;
the memory-mapped Arrow pages are file-backed page cache and not counted. Baseline in the same
run: the same books kept in a list as they are read (what reading a whole split into memory
costs). Goal: the lazy reader's peak does not grow with the number of books.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import timing


def read(split: str, mode: str) -> dict:
    """One child: every book of the split through `iter_books`, the peak anonymous resident MiB above the
    start (mapped Arrow file pages are page cache, reclaimable), the books kept in a list when `eager`."""
    from evalm.icl_eval.perplexity.books import iter_books

    import datasets  # noqa: F401 (imports done: measure from here)

    before, peak, n, held = timing.status_mib("RssAnon"), 0.0, 0, []
    for _, text in iter_books(["deepmind/pg19:" + split]):
        n += 1
        if mode == "eager":
            held.append(text)
        peak = max(peak, timing.status_mib("RssAnon") - before)
    return {"books": n, "peak_mib": peak}


def main(books: str = "20,80,320", kib: int = 400) -> None:
    counts = [int(x) for x in books.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["HF_HOME"] = str(Path(tmp) / "hf")  # the children's datasets cache
        from tests.hub_cache import write_hub_cache

        text = ("It was the best of times, it was the worst of times. " * (kib * 20))[: kib * 1024]
        splits = {f"n{n}": {"short_book_title": [f"Book {i}" for i in range(n)], "publication_date": [1900] * n,
                            "url": [""] * n, "text": [text] * n} for n in counts}
        write_hub_cache(Path(tmp), "deepmind/pg19", None, splits)
        print(timing.machine())
        print(f"{'books':>6} {'data MiB':>9} {'lazy peak MiB':>14} {'eager peak MiB':>15}")
        rows = []
        for n in counts:
            lazy, eager = (timing.child(__file__, "read", f"n{n}", mode)["peak_mib"] for mode in ("lazy", "eager"))
            rows.append((n, lazy, eager))
            print(f"{n:>6} {n * kib / 1024:>9.1f} {lazy:>14.1f} {eager:>15.1f}")
        (n0, l0, e0), (n1, l1, e1) = rows[0], rows[-1]
        print(f"{n1 // n0}x the books: lazy peak x{l1 / max(l0, 1e-9):.2f}, eager peak x{e1 / max(e0, 1e-9):.2f}")


if __name__ == "__main__":
    raise SystemExit(timing.cli(main, __doc__, {"read": read}))
