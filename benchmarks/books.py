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

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

READ = """
import json, sys
from evalm.icl_eval.perplexity.books import iter_books
import datasets  # imports done: measure from here
def rss():  # anonymous resident memory (MiB): mapped Arrow file pages are page cache, reclaimable
    line = [x for x in open("/proc/self/status") if x.startswith("RssAnon:")][0]
    return int(line.split()[1]) / 1024
before, peak, n, held = rss(), 0.0, 0, []
for name, text in iter_books(["deepmind/pg19:" + sys.argv[1]]):
    n += 1
    if sys.argv[2] == "eager":
        held.append(text)
    peak = max(peak, rss() - before)
print(json.dumps({"books": n, "peak_mib": peak}))
"""


def measure(hf_home: str, split: str, mode: str) -> dict:
    env = {**os.environ, "HF_HOME": hf_home, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", READ, split, mode], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    p.add_argument("--books", default="20,80,320", help="book counts, one split each (default 20,80,320)")
    p.add_argument("--kib", type=int, default=400, help="KiB per book (default 400, about PG-19's mean)")
    args = p.parse_args()
    counts = [int(x) for x in args.books.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["HF_HOME"] = str(Path(tmp) / "hf")
        from tests.hub_cache import write_hub_cache

        text = ("It was the best of times, it was the worst of times. " * (args.kib * 20))[: args.kib * 1024]
        splits = {f"n{n}": {"short_book_title": [f"Book {i}" for i in range(n)], "publication_date": [1900] * n,
                            "url": [""] * n, "text": [text] * n} for n in counts}
        write_hub_cache(Path(tmp), "deepmind/pg19", None, splits)
        print(f"{'books':>6} {'data MiB':>9} {'lazy peak MiB':>14} {'eager peak MiB':>15}")
        rows = []
        for n in counts:
            lazy, eager = measure(os.environ["HF_HOME"], f"n{n}", "lazy"), measure(os.environ["HF_HOME"], f"n{n}", "eager")
            rows.append((n, lazy["peak_mib"], eager["peak_mib"]))
            print(f"{n:>6} {n * args.kib / 1024:>9.1f} {lazy['peak_mib']:>14.1f} {eager['peak_mib']:>15.1f}")
        (n0, l0, e0), (n1, l1, e1) = rows[0], rows[-1]
        print(f"{n1 // n0}x the books: lazy peak x{l1 / max(l0, 1e-9):.2f}, eager peak x{e1 / max(e0, 1e-9):.2f}")


if __name__ == "__main__":
    main()
