"""The one rule every `evalm` command ends with (`config_toolkit.report`, used by `Dispatcher`): the
project's user-error types are one line and exit 2; anything else is a bug: one line that says so and
names the file holding its traceback, exit 1. A bug printed as "error: ..." sends the user to fix an
input that is fine.

Run: python -m pytest tests/config_toolkit/test_errors.py -q
"""

from __future__ import annotations

import pytest

from evalm.config_toolkit import ConfigError, Dispatcher, InputError, MissingExtra, MissingInput, UserError
from evalm.storage import DamagedFile, FolderBusy, NoSpace, folder_lock


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("EVALM_DEBUG", raising=False)
    monkeypatch.delenv("RANK", raising=False)


def _dispatch(fn) -> int:
    def run(argv):
        fn()
        return 0

    return Dispatcher("evalm demo", {"cmd": ("runs fn", run)}).main(["cmd"])


@pytest.mark.parametrize("err", [ConfigError("a.toml: steps: must be >= 1"),
                                 InputError("t.jsonl: line 2 has no 'text'"), MissingInput("x/: no config.json"), MissingExtra("pip install 'evalm[hf]'"),
                                 DamagedFile("c.json: not valid JSON"), FolderBusy("out is in use by pid 1"),
                                 NoSpace("no space left on device while writing f")])
def test_every_project_user_error_is_one_line_exit_2(err, capsys):
    def fail():
        raise err

    assert _dispatch(fail) == 2
    assert capsys.readouterr().err == f"evalm demo cmd: error: {err}\n"
    assert isinstance(err, UserError)


def test_the_user_types_keep_their_builtin_bases():
    """So every `except ValueError` / `except OSError` written before them still catches them."""
    assert issubclass(ConfigError, ValueError) and issubclass(InputError, ValueError)
    assert issubclass(DamagedFile, ValueError) and issubclass(MissingInput, FileNotFoundError)
    assert issubclass(FolderBusy, OSError) and issubclass(NoSpace, OSError) and issubclass(MissingExtra, ImportError)


@pytest.mark.parametrize("err", [ValueError("too many values to unpack"), IndexError("list index out of range"),
                                 KeyError("logits"), RuntimeError("shape mismatch"), FileNotFoundError("no such file"),
                                 OSError("device not ready")])
def test_a_builtin_error_is_a_bug_with_its_traceback_in_a_named_log(err, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))  # the fallback log folder: no output folder here

    def deep_inside():
        raise err

    assert _dispatch(deep_inside) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"evalm demo cmd: bug: {type(err).__name__}"), lines
    assert "not your input" in lines[0] and "error:" not in lines[0]
    logs = list((tmp_path / "evalm-errors").glob("*error.log"))
    assert len(logs) == 1 and f"traceback in {logs[0]};" in lines[0]
    trace = logs[0].read_text()
    assert trace.startswith("Traceback (most recent call last)") and "in deep_inside" in trace


def test_a_bug_inside_a_held_output_folder_logs_there(capsys, tmp_path):
    out = tmp_path / "out"

    def fail():
        with folder_lock(out, "evalm demo"):
            [][0]

    assert _dispatch(fail) == 1
    line = capsys.readouterr().err.strip()
    log = out / "logs" / "error.log"
    assert f"traceback in {log};" in line and "IndexError: list index out of range" in line
    assert "IndexError" in log.read_text()


def test_an_os_error_about_a_path_the_user_gave_is_one_line(capsys, tmp_path):
    missing = tmp_path / "nope.txt"

    def read():
        missing.read_text()

    assert _dispatch(read) == 2
    assert capsys.readouterr().err == f"evalm demo cmd: error: [Errno 2] No such file or directory: '{missing}'\n"

    def open_folder():
        tmp_path.read_text()

    assert _dispatch(open_folder) == 2
    assert "Is a directory" in capsys.readouterr().err


def test_debug_shows_the_traceback_instead(monkeypatch):
    monkeypatch.setenv("EVALM_DEBUG", "1")

    def fail():
        raise IndexError("deep")

    with pytest.raises(IndexError, match="deep"):
        _dispatch(fail)


def test_other_ranks_name_their_own_log(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")

    def fail():
        with folder_lock(tmp_path / "out", "evalm demo"):
            raise ValueError("rank 1 only")

    assert _dispatch(fail) == 1
    assert str(tmp_path / "out" / "logs" / "error-rank1.log") in capsys.readouterr().err


INTERNAL_ERRORS: dict[str, str] = {
    "RankZeroFailed": "what the other ranks of a torchrun launch raise when rank 0 hit a bug in work it did for "
                      "all of them (storage.ranks): a bug there is a bug here, never a line that sends the user to "
                      "fix an input",
    "KernelUnavailable": "the GPU route's kernel cannot serve a call (evalm/flex_kernel.py); EVA's layer always "
                         "catches it and answers with the recompute route and a warning, so it never reaches a user",
}
"""Exception classes of ours that are deliberately not user errors (reported as bugs), with the reason.
Every other class the packages define is a refusal a user can act on."""


def test_every_exception_class_of_ours_is_a_user_error():
    """A refusal type declared as `class X(ValueError)` would print as a bug: each exception class the
    packages define must reach `UserError` through its bases (or be listed in INTERNAL_ERRORS).
    A walk of the source's syntax trees, independent of the code under test."""
    import ast
    import builtins

    from tests.test_house import modules

    bases: dict[str, list[str]] = {}
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                names = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases]
                bases[f"{path.stem}.{node.name}"] = names
    by_name = {key.split(".")[1]: names for key, names in bases.items()}

    def reaches(name: str, target: str, seen=()) -> bool:
        if name == target:
            return True
        if name in seen:
            return False
        return any(reaches(b, target, (*seen, name)) for b in by_name.get(name, []))

    def is_exception(name: str, seen=()) -> bool:
        builtin = getattr(builtins, name, None)
        if isinstance(builtin, type) and issubclass(builtin, BaseException):
            return True
        return name not in seen and any(is_exception(b, (*seen, name)) for b in by_name.get(name, []))

    ours = sorted(key for key, names in bases.items() if any(is_exception(b) for b in names) or key.endswith("Error"))
    assert len(ours) >= 20  # the walk found them (ConfigError, FolderBusy, StageError, PromptTooLong, ...)
    not_user = [key for key in ours if not reaches(key.split(".")[1], "UserError")
                and key.split(".")[1] not in ("UserError", *INTERNAL_ERRORS)]
    assert not_user == [], f"inherit UserError (keeping the built-in base), or list as internal: {not_user}"
