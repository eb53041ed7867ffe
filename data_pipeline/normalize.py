"""Normalisation: edits, not filters (docs/data_pipeline.md; EVALM Appendix A.1 "standardizing the
whitespace and removing the non-ASCII characters").

Unicode space variants become a plain space, carriage returns become newlines, runs of spaces and
tabs collapse to one space, runs of three or more newlines collapse to a paragraph break (two),
spaces around newlines go; then every non-ASCII character is removed and the text is stripped.
The number of characters removed is returned so the runner can record it.
"""

from __future__ import annotations

import re

# Unicode "space separators" and the odd ASCII controls that act as spaces; newlines are kept
# because paragraph structure matters to the character/word repetition filters and to the LM.
_SPACES = re.compile(r"[\t\x0b\x0c\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000\u200b\ufeff ]+")
_CARRIAGE = re.compile(r"\r\n?|[\u2028\u2029\x85]")
_SPACE_AROUND_NEWLINE = re.compile(r" ?\n ?")
_MANY_NEWLINES = re.compile(r"\n{3,}")
_NON_ASCII = re.compile(r"[^\x00-\x7f]+")


def normalize(text: str) -> tuple[str, int]:
    """Return (normalised text, characters removed)."""
    out = _CARRIAGE.sub("\n", text)
    out = _SPACES.sub(" ", out)
    out = _NON_ASCII.sub("", out)
    # removing a non-ASCII word can leave two spaces side by side: collapse after the removal
    out = re.sub(r" {2,}", " ", out)
    out = _SPACE_AROUND_NEWLINE.sub("\n", out)
    out = _MANY_NEWLINES.sub("\n\n", out)
    out = out.strip()
    return out, len(text) - len(out)
