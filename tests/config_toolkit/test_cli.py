"""config_toolkit: the one-line-error Parser and the subcommand Dispatcher (real argparse, real imports).

Run: python -m pytest tests/config_toolkit/test_cli.py -q
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from evalm.config_toolkit import ConfigError, Dispatcher, MissingInput, Parser, UserError, lazy, report


class NoTask(UserError, KeyError):
    """A user error that is also a KeyError (whose str() would add quotes)."""


def test_parser_error_is_one_line_naming_the_flag(capsys):
    parser = Parser(prog="evalm x")
    parser.add_argument("--steps", type=int, help="steps (default: 1)")
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--steps", "many"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "evalm x: error: argument --steps: invalid int value: 'many' (see evalm x --help)\n"


def test_parser_keeps_line_breaks_and_wraps_only_long_lines(monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    text = "Examples:\n    evalm x --a 1\n" + " ".join(["word"] * 30)
    help_text = Parser(prog="p", description=text).format_help()
    assert "Examples:\n    evalm x --a 1\n" in help_text
    paragraph = help_text.split("evalm x --a 1\n", 1)[1].split("\n\n")[0].splitlines()
    assert len(paragraph) > 1 and all(len(line) <= 60 for line in paragraph)
    assert " ".join(paragraph).split() == ["word"] * 30


def _dispatcher(calls: list) -> Dispatcher:
    def ok(argv):
        calls.append(list(argv))
        return 0

    def broken(argv):
        raise ConfigError("run.toml: steps must be >= 1")

    def missing(argv):
        raise NoTask("no task 'x'")

    return Dispatcher("evalm demo", {"ok": ("does it", ok), "broken": ("fails", broken), "missing": ("fails", missing)},
                      footer="See docs/demo.md.")


def test_usage_lists_every_command_with_its_help(capsys):
    d = _dispatcher([])
    expected = ("usage: evalm demo COMMAND [ARGS...]\n\ncommands:\n  ok       does it\n  broken   fails\n"
                "  missing  fails\n\nSee docs/demo.md.\n")
    assert d.usage() == expected
    for argv in ([], ["--help"], ["-h"], ["help"]):
        assert d.main(argv) == 0
        assert capsys.readouterr().out == expected + "\n"


def test_usage_can_name_global_options_and_a_header():
    d = Dispatcher("evalm", {"run": ("every stage", lambda argv: 0)}, synopsis="[--debug] COMMAND [ARGS...]",
                   header="EVALM end to end.", footer="global options:\n  --debug  tracebacks")
    assert d.usage() == ("usage: evalm [--debug] COMMAND [ARGS...]\n\nEVALM end to end.\n\ncommands:\n"
                         "  run  every stage\n\nglobal options:\n  --debug  tracebacks\n")


def test_a_command_gets_the_remaining_arguments():
    calls = []
    assert _dispatcher(calls).main(["ok", "--x", "1"]) == 0
    assert calls == [["--x", "1"]]


def test_unknown_command_is_one_line_and_exit_2(capsys):
    assert _dispatcher([]).main(["nope"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("evalm demo: error: unknown command 'nope'; valid: ok, broken, missing "
                            "(see evalm demo --help)\n")


def test_user_errors_are_one_line_unless_debug(capsys, monkeypatch):
    monkeypatch.delenv("EVALM_DEBUG", raising=False)
    d = _dispatcher([])
    assert d.main(["broken"]) == 2
    assert capsys.readouterr().err == "evalm demo broken: error: run.toml: steps must be >= 1\n"
    assert d.main(["missing"]) == 2
    assert capsys.readouterr().err == "evalm demo missing: error: no task 'x'\n"  # not KeyError's quoted repr
    monkeypatch.setenv("EVALM_DEBUG", "1")
    with pytest.raises(ConfigError):
        d.main(["broken"])
    monkeypatch.setenv("EVALM_DEBUG", "0")
    assert d.main(["broken"]) == 2


def test_lazy_imports_its_module_only_when_the_command_runs(tmp_path, monkeypatch):
    (tmp_path / "lazy_probe_mod.py").write_text("def main(argv):\n    return 7 + len(argv)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lazy_probe_mod", raising=False)
    d = Dispatcher("evalm demo", {"probe": ("probe", lazy("lazy_probe_mod:main"))})
    assert "probe" in d.usage() and "lazy_probe_mod" not in sys.modules
    assert d.main(["probe", "a", "b"]) == 9
    assert "lazy_probe_mod" in sys.modules


@pytest.mark.parametrize("group", ["data", "train", "eval"])
def test_the_real_command_groups_dispatch_through_it(group):
    proc = subprocess.run([sys.executable, "-m", "evalm.launcher.cli", group, "nope"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"evalm {group}: error: unknown command 'nope'; valid: ")
    assert proc.stderr.count("\n") == 1


def test_report_is_one_line_and_exit_code_2_or_the_traceback_under_debug(capsys, monkeypatch):
    def failing(env: str) -> int:
        monkeypatch.setenv("EVALM_DEBUG", env)
        try:
            raise MissingInput("runs/x: not found; pass the run folder")
        except FileNotFoundError as err:  # a MissingInput is a FileNotFoundError too
            return report("evalm export", err)

    assert failing("0") == 2
    assert capsys.readouterr().err == "evalm export: error: runs/x: not found; pass the run folder\n"
    with pytest.raises(FileNotFoundError, match="runs/x"):
        failing("1")


def test_ctrl_c_ends_a_command_in_one_line_with_130():
    """A real SIGINT inside a command (its Python handler installed, as in a terminal): the shell's 130 and one
    line, not a traceback (`evalm train msit-data` printed one; `evalm run` reads 130 as an interruption)."""
    code = ("import os, signal, sys, time; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from evalm.config_toolkit import Dispatcher; "
            "stop = lambda argv: (os.kill(os.getpid(), signal.SIGINT), time.sleep(30)); "
            "sys.exit(Dispatcher('evalm demo', {'long': ('stopped by Ctrl-C', stop)}).main(['long']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (130, "evalm demo long: interrupted\n")
