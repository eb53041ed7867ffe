"""One owner per output folder: a lock that the operating system releases when its holder dies.

Two runs writing into one folder corrupt each other quietly (checkpoints of one run under the
other's config.json, interleaved metrics), so every command that writes a folder holds
`FOLDER/.evalm.lock` with `fcntl.flock` while it runs. The kernel drops a flock when the process
exits in any way, SIGKILL included: a lock file left behind by a dead run is only a file, and the
next run takes it at once. Its text (pid, host, command, start) exists only so that the refusal
can name the holder. Linux emulates flock with byte-range locks on NFS, so the lock also holds
between hosts that share the folder.

An error that escapes the held block is tagged with the folder, so that a bug's traceback is kept
in FOLDER/logs/error.log, beside the run it broke.

Within one process the lock is re-entrant (`evalm run` holds a folder whose stages lock it again),
because a second flock on a new file description would refuse its own process.

The lock file is opened with `O_NOFOLLOW` and must be a regular file with one name: a
`.evalm.lock` that is a symbolic link (or a hard link) to another file is refused, never followed,
truncated or written, whoever placed it there. The recorded command line is redacted
(`storage.secrets`): a `--redis-url` password never reaches the lock file.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from evalm.config_toolkit import UserError, note_folder
from evalm.storage.files import NoSpace
from evalm.storage.secrets import redact, redact_argv

LOCK_FILE = ".evalm.lock"
_HELD: dict[Path, int] = {}
"""Folders this process holds -> how many nested `folder_lock`s hold each."""


class FolderBusy(UserError, OSError):
    """Another live process writes this folder; the message names it."""


class NotAFolder(UserError, FileExistsError):
    """An output folder named a file (or something else that is not a folder)."""


class ForeignLock(UserError, OSError):
    """The folder's lock file is a link or not a regular file; the message names it."""


def _open_lock(path: Path):
    """The lock file, opened for reading and writing without following a link and without truncating:
    refused when it is a symbolic link, not a regular file, or has another name (a hard link)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except OSError as err:
        if err.errno != errno.ELOOP:
            raise
        raise ForeignLock(f"{path} is a symbolic link; a lock file is never followed (it would write into the "
                          "file it points to): remove the link and rerun") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        what = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"a file with {st.st_nlink} names (a hard link)"
        raise ForeignLock(f"{path} is {what}; a lock file is never written through it: remove it and rerun")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "r+", encoding="utf-8")


@contextmanager
def folder_lock(folder: str | Path, command: str) -> Iterator[Path]:
    """Hold `folder` (created if missing) for the duration; refuse at once if a live process holds it."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise NotAFolder(f"{folder} exists and is not a folder; the output of a command is a folder: give a new "
                         "name or an existing folder")
    folder.mkdir(parents=True, exist_ok=True)
    key = folder.resolve()
    if key in _HELD:
        _HELD[key] += 1
        try:
            yield folder
        finally:
            _HELD[key] -= 1
        return
    handle = _open_lock(folder / LOCK_FILE)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = _describe(handle.read())
        handle.close()
        raise FolderBusy(f"{folder} is in use by {holder}; wait for that run to end, or write to another "
                         "folder (two runs in one folder would overwrite each other's files)") from None
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "command": redact(command),
                                 "argv": redact_argv(sys.argv), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")
        handle.flush()
    except OSError as err:  # the OS names no file for a failed write: name it, and say what a full disk is
        _release(handle)
        raise _unwritable(err, folder / LOCK_FILE) from None
    _HELD[key] = 1
    try:
        yield folder
    except Exception as err:
        note_folder(err, folder)  # a bug's traceback goes to FOLDER/logs/error.log (config_toolkit.errors)
        raise
    finally:
        del _HELD[key]
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


def _release(handle) -> None:
    """Unlock and close a lock whose record could not be written; closing retries the buffered write, which
    fails the same way and is not news."""
    fcntl.flock(handle, fcntl.LOCK_UN)
    try:
        handle.close()
    except OSError:
        pass


def _unwritable(err: OSError, path: Path) -> OSError:
    """The error of a lock record that could not be written, naming the lock file."""
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return NoSpace(err.errno, f"{path}: the disk is full ({err.strerror}), so the folder's lock cannot be "
                       "written; free space on that disk or write to a folder on another one")
    return OSError(err.errno, err.strerror, str(path))


def _describe(text: str) -> str:
    """`pid 123 on host (evalm train pretrain, since ...)`, or what can be said of an unreadable record."""
    try:
        record = json.loads(text)
        return f"pid {record['pid']} on {record['host']} ({record['command']}, since {record['since']})"
    except (ValueError, KeyError, TypeError):
        return "another process (its lock record is unreadable)"
