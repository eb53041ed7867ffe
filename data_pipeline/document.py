"""A document as every stage sees it: id, normalised-or-raw text, Pile subset, free metadata.

Slotted like datatrove's `Document` and duck-compatible with its
readers and writers (`text`, `id`, `metadata`), so datatrove's I/O carries it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Document:
    id: str
    text: str
    subset: str
    """Pile subset name (`meta.pile_set_name`), '' when the source does not say."""
    metadata: dict[str, Any] = field(default_factory=dict)
    annotations: dict[str, Any] = field(default_factory=dict)
    """Top-level fields a stage adds to the record (`filter_reason`, `dedup_component`...)."""
    media: list = field(default_factory=list)  # datatrove's writers read it; always empty here

    def to_record(self) -> dict[str, Any]:
        """The on-disk JSON form: `id`, `text`, `metadata` (with `pile_set_name`), annotations."""
        metadata = {**self.metadata, "pile_set_name": self.subset}
        return {"id": self.id, "text": self.text, "metadata": metadata, **self.annotations}


def subset_of(record: dict[str, Any]) -> str:
    """The Pile keeps the subset in `meta.pile_set_name`; our own outputs in `metadata`."""
    for key in ("meta", "metadata"):
        meta = record.get(key)
        if isinstance(meta, dict) and isinstance(meta.get("pile_set_name"), str):
            return meta["pile_set_name"]
    return ""


def from_record(record: dict[str, Any], default_id: str) -> Document:
    """Build a Document from a parsed JSON/parquet row; the caller has checked `text` is a str."""
    metadata = {}
    for key in ("meta", "metadata"):
        if isinstance(record.get(key), dict):
            metadata.update(record[key])
    metadata.pop("pile_set_name", None)
    doc_id = record.get("id")
    return Document(
        id=str(doc_id) if doc_id is not None else default_id,
        text=record["text"],
        subset=subset_of(record),
        metadata=metadata,
    )
