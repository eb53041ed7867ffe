"""Cleaning wikitext: gensim's shortened English Wikipedia dump as plain-text articles."""

from __future__ import annotations

import bz2
import html
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator

from evalm.data_pipeline.samples.archive import Archive
from evalm.data_pipeline.samples.packages import WIKI_BZ2

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

