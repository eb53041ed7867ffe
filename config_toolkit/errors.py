"""What the user can fix and what is a bug of ours, told apart in one place for every `evalm` command.

A user error is one of the project's own types below (or inherits from `UserError`): its message
names the file, key or flag, what was wrong and what to do, so the console shows that one line and
the command exits 2. Each type keeps a built-in base as well (`ConfigError` is a ValueError,
`MissingInput` a FileNotFoundError, `MissingExtra` an ImportError), so code that catches the
built-in still catches it.

Anything else that escapes a command is a bug: a message written for a user was never attached to
it, and printing `error: list index out of range` would send the user to fix an input that is fine.
`report` writes its traceback to a log file (`OUT/logs/error.log` of the folder the command was
writing, else a file under the system's temporary folder), prints one line that says it is a bug
and names that file, and the command exits 1.

One narrow rule admits built-in errors as user errors: an OSError that the operating system raised
about a path it names (`err.filename`): no such file, permission denied, a directory where a file
was expected, a full disk, a read-only filesystem, a loop of symbolic links. The user passed that
path, or owns that disk, and the path in the message is what they need; wrapping every `open()` of
a path a user gave would say the same thing in more code. A deliberate refusal about a missing file
(which the OS did not name) is a `MissingInput`.

`evalm --debug` (EVALM_DEBUG=1) shows the traceback of either on the console instead.
"""

from __future__ import annotations

import errno
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path


class UserError(Exception):
    """A mistake the user can fix from the message alone (file, what is wrong, what to do): one line."""


class ConfigError(UserError, ValueError):
    """A config file, flag, override or value that cannot be used; the message says where and what to do."""


class InputError(UserError, ValueError):
    """An input file or folder whose content cannot be used (a task file, a data row, a shard folder)."""


class MissingInput(UserError, FileNotFoundError):
    """A file or folder the user named, or the command needs from an earlier one, is not there."""


class MissingExtra(UserError, ImportError):
    """An optional dependency the chosen option needs is not installed; the message gives the pip command."""


USER_OS_ERRORS = {errno.ENOENT, errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR, errno.ENOSPC,
                  errno.EDQUOT, errno.EROFS, errno.ENAMETOOLONG, errno.ELOOP}
"""Errnos of an OSError about a named path that the user causes and can fix (see the module docstring)."""

LOG_NAME = "error.log"
"""The bug log inside a command's output folder: OUT/logs/error.log."""


def debug() -> bool:
    """`evalm --debug` (EVALM_DEBUG=1): errors show their traceback instead of one line."""
    return os.environ.get("EVALM_DEBUG", "") not in ("", "0")


def is_user_error(err: BaseException) -> bool:
    """One of the project's user-error types, or an OSError the OS raised about a path it names."""
    if isinstance(err, UserError):
        return True
    return isinstance(err, OSError) and err.filename is not None and err.errno in USER_OS_ERRORS


def note_folder(err: BaseException, folder: str | Path) -> None:
    """Record on `err` the output folder it escaped from (the innermost one), where its bug log goes."""
    if getattr(err, "evalm_folder", None) is None:
        err.evalm_folder = Path(folder)


def bug_log(err: BaseException) -> Path:
    """Where the traceback of a bug goes: OUT/logs/error.log of the folder `err` escaped from
    (`note_folder`), else a new file under the temporary folder. Ranks other than 0 of a
    distributed run write error-rankN.log beside it."""
    rank = os.environ.get("RANK", "0")
    name = LOG_NAME if rank in ("", "0") else f"error-rank{rank}.log"
    folder = getattr(err, "evalm_folder", None)
    if folder is not None:
        return Path(folder) / "logs" / name
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(tempfile.gettempdir()) / "evalm-errors" / f"{stamp}-pid{os.getpid()}-{name}"


def report(prog: str, err: BaseException) -> int:
    """The one rule, inside an `except Exception` of a command: returns its exit code.

    A user error prints `prog: error: MESSAGE` (2); anything else prints `prog: bug: TYPE: MESSAGE
    (...) traceback in LOG` and writes the traceback to LOG (1). Under --debug, re-raises (the
    traceback on the console). A broken pipe (`evalm ... --help | head`: the reader left) is neither:
    it goes on up to `evalm`'s own handler, which exits quietly."""
    if debug() or isinstance(err, BrokenPipeError):
        raise err
    if is_user_error(err):
        message = err.args[0] if isinstance(err, KeyError) and err.args else err  # KeyError's str() adds quotes
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 2
    log = bug_log(err)
    where = _write(log, "".join(traceback.format_exception(err)))
    summary = f"{type(err).__name__}: {err}".splitlines()[0] if str(err) else type(err).__name__
    print(f"{prog}: bug: {summary} (an internal error, not your input; traceback in {where}; "
          "please report it with that file)", file=sys.stderr)
    return 1


def _write(log: Path, text: str) -> str:
    """Write the traceback; if even that fails (a full or read-only disk), say so instead of a path."""
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(text, encoding="utf-8")
    except OSError as err:
        return f"nowhere ({log} could not be written: {err}; rerun with `evalm --debug` to see it)"
    return str(log)
