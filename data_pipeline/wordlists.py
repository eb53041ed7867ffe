"""Word lists shipped as text files with a provenance header (docs/data_pipeline.md).

One entry per line; lines starting with '#' are the header (source, licence) and comments.
Entries are normalised the way the filters normalise words (lower case, special characters
stripped at both ends), so a list entry and a document word compare equal. Never fetched at
run time: the default files live beside this module; a config may point elsewhere.
"""

from __future__ import annotations

from pathlib import Path

from evalm.config_toolkit import InputError, MissingInput

SHIPPED = Path(__file__).with_name("wordlists")
DEFAULT_STOPWORDS = SHIPPED / "en_stopwords.txt"
DEFAULT_FLAGGED = SHIPPED / "en_flagged.txt"


def load(path: str | Path, *, normalize_word) -> frozenset[str]:
    """Read a word list; `normalize_word` is filters.normalize_word (passed to avoid a cycle)."""
    path = Path(path)
    if not path.is_file():
        raise MissingInput(
            f"{path}: word list not found; point the config at a text file with one word per line "
            f"(defaults ship in {SHIPPED})"
        )
    words = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") or not line.strip():
            continue
        word = normalize_word(line.strip())
        if word:
            words.add(word)
    if not words:
        raise InputError(f"{path}: word list has no entries")
    return frozenset(words)


def provenance(path: str | Path) -> list[str]:
    """The header lines of a list, recorded in every filter output's config.json."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [line[1:].strip() for line in lines if line.startswith("#")]
