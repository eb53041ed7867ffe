"""What the build writes and where it came from: pile documents, provenance, the manifest's file entries."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import zstandard

from evalm.storage import sha256
from evalm.data_pipeline.samples.packages import Package


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
    """Sources of one output file, for the manifest. A package key that is not in the packages
    table ("samples.py", the module this build once was; kept so manifests stay byte-identical)
    marks content made here: templates, generated tables."""

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


@dataclass
class Output:
    """The folder being built and the manifest entry (size, sha256, sources) of every file in it."""

    root: Path
    packages: dict[str, Package]
    files: dict[str, dict[str, Any]] = field(default_factory=dict)

    def rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def record(self, rel: str, prov: Provenance, **info: Any) -> None:
        path = self.root / rel
        self.files[rel] = {"bytes": path.stat().st_size, "sha256": sha256(path), **info,
                           "sources": prov.entries(self.packages)}


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]], *, zstd: bool = False) -> None:
    data = b"".join(orjson.dumps(r) + b"\n" for r in rows)
    if zstd:
        data = zstandard.ZstdCompressor(level=10).compress(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)

