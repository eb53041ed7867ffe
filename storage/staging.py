"""Files written aside and moved into place complete: an output folder never holds half a model.

`evalm convert`, `evalm export` and an uptraining run's OUT/hf write a model as several files
(weights, config.json, tokenizer files, a modeling file, a record), most through libraries that write
each file where they are told (`save_pretrained`). Written straight into the output, a process
killed between two files left a folder every loader took for a model (its config.json there, its
tokenizer missing): the next evaluation failed with a bug line. So `staged` gives a hidden folder
inside the output to write into; when the block ends without an error its entries are renamed into
the output, `last` (config.json: what every loader opens first, and requires) after all the others,
so a folder without it is never a model, and one with it is complete. An output folder that is a symbolic
link is refused before anything is made (a run's `hf/` linked elsewhere was written through), and so is a
destination file that is a link (or not a regular file) before anything moves (`files.refuse_link`). On an error, and
for a staging folder a killed process left, the staging folder is removed.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from evalm.storage.files import LinkedOutput, refuse_link

STAGING = ".staging-"
"""Prefix of the hidden staging folders (`.staging-PID`) inside an output folder."""


@contextmanager
def staged(folder: str | Path, last: Sequence[str] = ("config.json",)) -> Iterator[Path]:
    """A new hidden folder inside `folder` to write into; moved into `folder` on a clean exit (`last` moved
    last), removed on an error."""
    folder = Path(folder)
    if folder.is_symlink():  # its files would land in the folder it points to
        raise LinkedOutput(f"{folder} is a symbolic link (to {os.readlink(folder)}); evalm never writes through a "
                           "link: remove the link and rerun")
    if folder.exists() and not folder.is_dir():
        raise LinkedOutput(f"{folder} is a file, not a folder; the output is written as a folder: remove the file "
                           "or choose another output")
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(f"{STAGING}*"):  # a killed process's
        shutil.rmtree(stale, ignore_errors=True)
    stage = folder / f"{STAGING}{os.getpid()}"
    stage.mkdir()
    try:
        yield stage
        entries = sorted(stage.iterdir(), key=lambda p: (p.name in last, last.index(p.name) if p.name in last else 0))
        for entry in entries:
            refuse_link(folder / entry.name)
        for entry in entries:
            os.replace(entry, folder / entry.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
