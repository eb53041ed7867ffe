"""The one owner of a command's output folder: lock, made-by marker, recorded settings, identities, writes.

Every command that writes a folder (`evalm train pretrain|msit`, `evalm export`, `evalm eval
icl|ppl`, `evalm data filter|dedup|blend`, `evalm run`) does the same things to it, here once:

- **hold** it (`storage.lock`): rank 0 of a torchrun launch takes the lock for every rank, and what
  rank 0 does for all of them is shared with its value or its error, a user error staying one and a
  bug a bug (`storage.ranks`);
- **claim** it: a command writes only into a folder it made (its marker names the command) or an
  empty one, and never into one of its inputs (the model it reads, its data) or a folder inside one
  (`claim`); a stage folder `evalm run` made for its stages is taken by the stage's command;
- **mark** what it made: a folder the command creates (or finds empty) gets `.evalm-folder.json`
  naming the command; `--overwrite` deletes only a folder whose marker names the same command, and
  never one that is, or holds, an input of the run (`discard`);
- **record** the settings its finished work was computed from, and refuse a relaunch whose settings
  differ, naming the keys (`record`; `storage.settings`);
- know its inputs by **identity**: the SHA-256 of their bytes, cached in the folder under each file's
  `stat` (`storage.identity`);
- write the files a later run reads **atomically** (`storage.files.replaced`).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from evalm.config_toolkit import UserError, note_folder
from evalm.storage.files import LinkedOutput, read_json, write_json
from evalm.storage.identity import DigestCache
from evalm.storage.lock import LOCK_FILE, folder_lock
from evalm.storage.ranks import Ranks
from evalm.storage.settings import SettingsChanged, as_read_back, describe, differences
from evalm.storage.staging import STAGING

MARKER = ".evalm-folder.json"
"""`{"command": ..., "made": ...}` in a folder a command created: what `--overwrite` may delete."""
DIGESTS = ".evalm-digests.json"
"""The folder's digest cache (`storage.identity.DigestCache`)."""
KEPT = (LOCK_FILE, MARKER)
"""A folder holding only these holds nothing of a run."""
BOOKKEEPING = (*KEPT, DIGESTS)
"""What a folder records about itself, not what a run wrote in it (two equal runs differ only there)."""
RUN = "evalm run"
"""`evalm run` marks each stage folder it creates; the stage's own command takes such a folder."""


class NotOurs(UserError, OSError):
    """A folder `--overwrite` would delete that the command did not make, or that holds an input."""


def made_by(folder: str | Path) -> str | None:
    """The command named by `folder`'s marker, None without one (or with an unreadable one)."""
    path = Path(folder) / MARKER
    try:
        record = read_json(path) if path.is_file() else None
    except (UserError, OSError):
        return None
    return record.get("command") if isinstance(record, dict) else None


def is_empty(folder: str | Path) -> bool:
    """Whether `folder` holds nothing but a lock, a marker and what a killed write left in staging (or does
    not exist)."""
    folder = Path(folder)
    return not folder.is_dir() or all(p.name in KEPT or p.name.startswith(STAGING) for p in folder.iterdir())


def overlap(a: str | Path, b: str | Path) -> bool:
    """Whether one path is the other or lies inside it (resolved, links followed)."""
    a, b = Path(a).resolve(), Path(b).resolve()
    return a == b or a in b.parents or b in a.parents


def inside(a: str | Path, b: str | Path) -> bool:
    """Whether `a` is `b` or lies inside it (resolved, links followed)."""
    a, b = Path(a).resolve(), Path(b).resolve()
    return a == b or b in a.parents


def foreign(folder: Path, command: str) -> str | None:
    """Why `command` may not write into `folder` (None when it may): the folder is neither empty nor made by
    `command` (or by `evalm run` for its stage)."""
    if is_empty(folder):
        return None
    maker = made_by(folder)
    if maker in (command, RUN):
        return None
    return f"it was made by `{maker}`" if maker else f"it has no {MARKER} naming the command that made it"


def guard_inputs(folder: str | Path, inputs: Sequence[str | Path], action: str) -> None:
    """Refuse `action` on `folder` when it is an input, holds one, or lies inside one."""
    for path in inputs:
        if path and overlap(folder, path):
            raise NotOurs(f"{folder} overlaps the input {path}; {action} would destroy or mix in what the "
                          "run reads: choose an output folder apart from every input")


class RunFolder:
    """One command's output folder (`path`), as `command` (e.g. "evalm data filter") writes it."""

    def __init__(self, path: str | Path, command: str, ranks: Ranks = Ranks(), inputs: Sequence[str | Path] = ()):
        self.path, self.command, self.ranks = Path(path), command, ranks
        self.inputs = [Path(i) for i in inputs if i]
        """What the command reads (a model, its data): never written into."""
        self._digests: DigestCache | None = None

    @contextmanager
    def held(self) -> Iterator[RunFolder]:
        """Hold the folder for the block: rank 0 takes the lock (refusing a folder another live run
        holds, or a path that is not a folder), `claim`s it and marks a new or empty folder as this
        command's; an error escaping the block on any rank is tagged with the folder, where its bug log goes."""
        with ExitStack() as stack:
            def take() -> None:
                self.refuse_inputs()
                stack.enter_context(folder_lock(self.path, self.command))
                self.claim()
                self.mark()

            try:
                self.ranks.share(take)
                yield self
            except Exception as err:
                if self.path.is_dir():  # every rank's bug log goes to FOLDER/logs (only rank 0 holds the lock)
                    note_folder(err, self.path)
                raise

    def share(self, action: Callable[[], Any]) -> Any:
        """`action()` on rank 0 for every rank (`storage.ranks.Ranks.share`)."""
        return self.ranks.share(action)

    def refuse_inputs(self) -> None:
        """Refuse a folder that is one of the command's inputs or lies inside one (before anything is made
        there: not even the lock file): `eval icl --out MODEL` replaced the model's config.json."""
        for path in self.inputs:
            if path.exists() and inside(self.path, path):
                raise NotOurs(f"{self.path} is, or lies inside, {path}, which `{self.command}` reads; it would "
                              "write into its own input: choose an output folder apart from every input")

    def claim(self) -> None:
        """Refuse a folder this command did not make that holds anything (a training run, an export, a
        data stage, the user's own files): only an empty folder or one of its own is written into."""
        why = foreign(self.path, self.command)
        if why:
            raise NotOurs(f"`{self.command}` writes only into a folder it made or an empty one, and {self.path} is "
                          f"not one ({why}); choose another output folder, or delete it yourself if it is disposable")

    def mark(self, sub: str | None = None) -> Path:
        """Create FOLDER[/sub]; mark it as this command's when it is new or empty (or a stage folder
        `evalm run` made for it). A sub-folder that is a symbolic link is refused. Returns it."""
        folder = self.path / sub if sub else self.path
        if sub and folder.is_symlink():
            raise LinkedOutput(f"{folder} is a symbolic link; evalm never writes through a link (its files would "
                               "land in the folder it points to): remove the link and rerun")
        fresh = is_empty(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if fresh and made_by(folder) in (None, RUN):
            write_json(folder / MARKER, {"command": self.command, "made": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        return folder

    def discard(self, sub: str | None = None, inputs: Sequence[str | Path] = (), flag: str = "--overwrite") -> None:
        """`--overwrite`: delete what an earlier launch wrote in FOLDER[/sub], only when this command
        made it (its marker) and it is no input of this run nor holds one; the lock and marker of the
        folder itself stay (deleting the lock would let a second run lock a new file beside ours)."""
        folder = self.path / sub if sub else self.path
        if is_empty(folder):
            return
        guard_inputs(folder, inputs, flag)
        maker = made_by(folder)
        if maker != self.command:
            whose = f"it was made by `{maker}`" if maker else f"it has no {MARKER} naming the command that made it"
            raise NotOurs(f"{flag} deletes only a folder `{self.command}` made, and {folder} is not one ({whose}); "
                          "delete it yourself if it is disposable, or choose another output folder")
        if sub:
            shutil.rmtree(folder)
            return
        for child in folder.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            elif child.name not in KEPT:
                child.unlink()

    def record(self, name: str, settings: dict[str, Any], *, ignore: Sequence[str] = (), added: Sequence[str] = (),
               what: str = "was made with other settings", advice: Callable[[list[str]], str]) -> bool:
        """Write FOLDER/name (JSON) on the first launch and return True; on a relaunch compare it and
        return False, or refuse naming the differing keys (`ignore`: keys a relaunch may change,
        recorded anew; `added`: keys that folders recorded before the key existed lack)."""
        path, now = self.path / name, as_read_back(settings)
        if not path.is_file():
            write_json(path, now)
            return True
        before = read_json(path)
        if not isinstance(before, dict):
            before = {name: "not the settings object it was written as"}
        before = {**{k: now[k] for k in added if k in now and k not in before}, **before}
        changed = differences(before, now, ignore)
        if changed:
            raise SettingsChanged(f"{path.parent} {what}: {describe(before, now, changed)}. {advice(changed)}")
        if before != now:  # a key a relaunch may change did: record what this launch uses
            write_json(path, now)
        return False

    def identity(self, path: str | Path) -> str | None:
        """`sha256:HEX` of a file or folder the run reads (None when missing), cached in FOLDER/.evalm-digests.json."""
        return self.identities([path])[0]

    def identities(self, paths: Sequence[str | Path]) -> list[str | None]:
        """`identity` of each path, the cache written once for all of them (a stage may read thousands of files)."""
        if self._digests is None:
            self._digests = DigestCache(self.path / DIGESTS)
        try:
            return [self._digests.identity(p) for p in paths]
        finally:
            if self.path.is_dir():
                self._digests.save()

    def write_json(self, name: str, value: Any, indent: int | None = 2) -> Path:
        """FOLDER/name written whole or not at all."""
        return write_json(self.path / name, value, indent=indent)
