"""JSON and text files read so that a broken one is named; writes whole or not at all, and that say
when the disk is full.

A user who hands us a damaged `config.json`, a binary file as a "book", or a disk that fills up
during a save must learn which file and what to do, in one line: not a decoder's traceback, and
never a result computed from U+FFFD replacement characters.

Every file a later run reads back (settings, markers, unit results, manifests, caches) is written
to a hidden temporary name beside it, flushed to disk, then renamed over it (`os.replace` is atomic
on POSIX), so a process killed at any moment leaves the old file or the new one, never half of one.
A name that is a symbolic link (or anything but a regular file) is refused before anything is
written (`refuse_link`): a `results.json` linked to a file elsewhere was overwritten through the link.

What a command reads as a small file (a config, a task file, a model's config.json) is read by
`read_bounded` (config_toolkit/files.py, re-exported here): a regular file (a FIFO blocked the read
forever, a link to `/dev/zero` filled memory) of at most a stated size, refused in one line otherwise.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from evalm.config_toolkit import UserError
from evalm.config_toolkit.files import MiB, NotRegular, kind_of, read_bounded, regular  # noqa: F401 - re-exported

MAX_UNDECODABLE = 0.001
"""Share of a text file's bytes that may be invalid UTF-8 (old scans carry a stray byte or two);
past it the file is not text in any encoding we read."""


class DamagedFile(UserError, ValueError):
    """A file that exists but cannot be what it claims to be; the message names it."""


class NoSpace(UserError, OSError):
    """A write failed because its filesystem is full; the message names the file."""


class LinkedOutput(UserError, OSError):
    """A file a command would write is a symbolic link or not a regular file; the message names it."""


def refuse_link(path: str | Path) -> Path:
    """`path` when nothing is there or a regular file is; a symbolic link (even a dangling one) or a
    FIFO, device or folder in its place is refused: writing there would write through the link into
    another file, or block."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    if stat.S_ISLNK(st.st_mode):
        raise LinkedOutput(f"{path} is a symbolic link (to {os.readlink(path)}); evalm never writes through a link "
                           "(it would overwrite the file it points to): remove the link and rerun")
    if not stat.S_ISREG(st.st_mode):
        raise LinkedOutput(f"{path} is {kind_of(st.st_mode)}, not a regular file; evalm writes its outputs only as "
                           "regular files: remove it and rerun")
    return path


MAX_JSON_BYTES = 256 * MiB
"""The largest JSON file read (a config.json is kilobytes; a digest cache of a large data set megabytes)."""


def read_json(path: str | Path, what: str = "a JSON file", limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON value of `path` (a regular file of at most `limit` bytes), or DamagedFile naming the
    file, line and column."""
    path = Path(path)
    try:
        return json.loads(read_bounded(path, limit, what).decode("utf-8"))
    except UnicodeDecodeError as err:
        raise DamagedFile(f"{path}: not JSON (not UTF-8 text at byte {err.start}); restore it or "
                          "re-create it with the command that wrote it") from None
    except json.JSONDecodeError as err:
        raise DamagedFile(f"{path}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg}); "
                          "restore it or re-create it with the command that wrote it") from None
    except RecursionError:  # `[[[[...]]]]` thousands deep: json recurses per level
        raise DamagedFile(f"{path}: nested deeper than the JSON reader can follow; restore it or re-create it "
                          "with the command that wrote it") from None


def read_text(path: str | Path, what: str = "text file") -> str:
    """UTF-8 text of `path`; refuses a file with NUL bytes or more than MAX_UNDECODABLE invalid bytes."""
    path = Path(path)
    data = path.read_bytes()
    if b"\x00" in data:
        raise DamagedFile(f"{path}: not a {what} (it holds NUL bytes at offset {data.index(0)}: a binary file?); "
                          "remove it from the input")
    text = data.decode("utf-8", errors="replace")
    bad = text.count("\ufffd") - data.decode("utf-8", errors="ignore").count("\ufffd")
    if bad > MAX_UNDECODABLE * max(len(data), 1):
        raise DamagedFile(f"{path}: not a UTF-8 {what} ({bad} of {len(data)} bytes are not UTF-8); convert it "
                          "to UTF-8 or remove it from the input")
    return text


def space_error(err: BaseException, path: str | Path, after: str = "", needed: int = 0) -> NoSpace | None:
    """A NoSpace naming the file when `err`, or an error it wraps, is ENOSPC, or when the filesystem
    of `path` has less than `needed` bytes (at least 1 MiB) free after the failure: writers such as
    torch.save's zip writer turn a short write into "unexpected pos 704 vs 598" and lose the errno.
    Else None. `after` is appended to the message (what survived, how to go on)."""
    pending, seen = [err], set()
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return NoSpace(errno.ENOSPC, f"no space left on device while writing {e.filename or path}; free "
                           f"space or write elsewhere{after}")
        # torch.distributed.checkpoint wraps each rank's error: {rank: (exception, traceback)}
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            pending += [f[0] if isinstance(f, tuple) else f for f in failures.values()]
        pending += [e.__cause__, e.__context__]
    path = Path(path)
    anchor = next((p for p in (path, *path.parents) if p.exists()), Path("/"))
    free = shutil.disk_usage(anchor).free
    if free >= max(needed, 1 << 20):
        return None
    written = sorted((p for p in path.rglob("*") if p.is_file()), key=lambda p: p.stat().st_mtime) if path.is_dir() else []
    where = written[-1] if written else path
    return NoSpace(errno.ENOSPC, f"no space left on device while writing {where} ({free} bytes free there, "
                   f"{needed} needed); free space or write elsewhere{after}")


TEMPORARY = ".tmp-"
"""Infix of the temporary files `replaced` writes (`.NAME.tmp-PID`): hidden, and found by `temporaries`."""


def appended(path: str | Path):
    """`path` opened for appending text (created if missing), never through a link (O_NOFOLLOW) nor into a file
    with another name (a hard link): a log or a metrics file linked to another file would grow that file."""
    path = refuse_link(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as err:
        if err.errno != errno.ELOOP:
            raise
        refuse_link(path)  # placed since: the message names its target
        raise
    names = os.fstat(fd).st_nlink
    if names > 1:
        os.close(fd)
        raise LinkedOutput(f"{path} is a file with {names} names (a hard link); evalm never appends into a file "
                           "another name shares (it would grow that file): remove it and rerun")
    return os.fdopen(fd, "a", encoding="utf-8")


@contextmanager
def replaced(path: str | Path) -> Iterator[Path]:
    """A temporary path beside `path` to write; on a clean exit it is flushed to disk and renamed over
    `path` (the parent folder is created), on an error removed, so `path` is old or new, never half.
    A `path` that is a link is refused first (`refuse_link`); the temporary file is created new, never
    followed (O_EXCL | O_NOFOLLOW)."""
    path = refuse_link(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}{TEMPORARY}{os.getpid()}")
    tmp.unlink(missing_ok=True)
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        refuse_link(path)  # placed while the file was being written
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write `data` (text as UTF-8) to `path` whole or not at all (`replaced`)."""
    with replaced(path) as tmp:
        tmp.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)


def write_json(path: str | Path, value: Any, indent: int | None = 2) -> Path:
    """`value` as JSON (keys in the order given, a final newline), written atomically."""
    return write_atomic(path, json.dumps(value, indent=indent) + "\n")


def temporaries(folder: str | Path) -> list[Path]:
    """Temporary files `replaced` left in `folder` when its process was killed mid-write."""
    return sorted(Path(folder).glob(f".*{TEMPORARY}*"))
