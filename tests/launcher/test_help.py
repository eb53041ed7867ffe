"""Every option of every `evalm` command has help text that states its default (or that it is required);
the help lists methods, tasks and protocols, names no file outside the repository; `--version` works.

The parsers are the real ones: each command's `--help` is run through its entry point and the
parser that prints it is captured.

Run: python -m pytest tests/launcher/test_help.py -q
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from evalm.launcher import cli as top

REPO = Path(__file__).resolve().parents[2]


def _subcommands() -> list[list[str]]:
    from evalm.data_pipeline.cli import COMMANDS as DATA
    from evalm.icl_eval.cli import COMMANDS as EVAL
    from evalm.train.cli import COMMANDS as TRAIN
    from evalm.launcher.study_aliases import ALIASES as STUDY

    nested = {"data": DATA, "train": TRAIN, "eval": EVAL, "study": STUDY}
    return [[name, sub] for name in top.COMMANDS for sub in nested.get(name, [None])]


def _parser(argv: list[str], monkeypatch) -> argparse.ArgumentParser:
    """The parser that `evalm ARGV --help` prints."""
    seen: list[argparse.ArgumentParser] = []
    monkeypatch.setattr(argparse.ArgumentParser, "print_help", lambda self, file=None: seen.append(self))
    with pytest.raises(SystemExit) as exit_:
        top.main([*argv, "--help"])
    assert exit_.value.code in (0, None) and len(seen) == 1, argv
    return seen[0]


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    return parser._get_formatter()._expand_help(action) if action.help else ""


@pytest.mark.parametrize("argv", [[c for c in a if c] for a in _subcommands()], ids=lambda a: " ".join(a))
def test_every_option_has_help_with_its_default(argv, monkeypatch):
    parser = _parser(argv, monkeypatch)
    missing = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        text = _help(parser, action)
        if not text or not re.search(r"\bdefault\b|\brequired\b", text, re.IGNORECASE):
            missing.append(f"{'/'.join(action.option_strings) or action.dest}: {text!r}")
    assert not missing, f"evalm {' '.join(argv)}: options without help or default: {missing}"


def _all_help_text(monkeypatch) -> str:
    texts = [top.usage()]
    for argv in _subcommands():
        parser = _parser([c for c in argv if c], monkeypatch)
        texts.append(parser.format_help())
    return "\n".join(texts)


def test_help_lists_methods_tasks_protocols_and_names_no_file_outside_the_repo(monkeypatch):
    from evalm.icl_eval.methods.decoder import METHODS
    from evalm.icl_eval.tasks.task import TEMPLATE_SETS

    icl = _parser(["eval", "icl"], monkeypatch).format_help()
    assert all(name in icl for name in METHODS)
    assert all(task in icl for tasks in TEMPLATE_SETS.values() for task in tasks)
    ppl = _parser(["eval", "ppl"], monkeypatch).format_help()
    assert all(p in ppl for p in ("cached", "nonoverlap", "sliding", "fixed-position", "unigram"))
    text = _all_help_text(monkeypatch)
    assert "../" not in text
    named = set(re.findall(r"[\w./-]+\.md\b", text))
    outside = sorted(n for n in named if not (REPO / n).is_file())
    assert not outside, f"help names files not in the repository: {outside}"


def test_docs_name_no_spec_file_outside_the_repo():
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for path in docs:
        text = path.read_text()
        assert "../shared" not in text and "/work/shared" not in text, path
        for name in set(re.findall(r"\b[A-Z_]+_SPEC\.md\b|\bARCHITECTURE\.md\b|\bSTYLE\.md\b", text)):
            assert (REPO / name).is_file() or list(REPO.rglob(name)), f"{path.name} names {name}, not in the repository"


def test_version_prints_the_package_version():
    expected = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    proc = subprocess.run([sys.executable, "-m", "evalm.launcher.cli", "--version"], capture_output=True, text=True,
                          cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == f"evalm {expected}", proc


@pytest.mark.parametrize("argv", [[c for c in a if c] for a in _subcommands()], ids=lambda a: " ".join(a))
def test_every_command_reads_only_whole_flag_names(argv, monkeypatch):
    """argparse's prefix matching would take a typo (`--shot`) as the flag it begins (`--shots`)."""
    assert _parser(argv, monkeypatch).allow_abbrev is False, f"evalm {' '.join(argv)}"


def _argparse_calls(path: Path) -> list[ast.Call]:
    return [node for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "ArgumentParser"]


def test_every_parser_in_the_project_disables_abbreviation():
    """House style, on the source: each argparse parser (benchmarks and scripts included) passes
    allow_abbrev=False, and the project's `Parser` forces it whatever its caller passes."""
    from evalm.config_toolkit import Parser

    assert Parser(prog="p", allow_abbrev=True).allow_abbrev is False
    files = [p for p in REPO.rglob("*.py") if not ({".venv", "tests", "build"} & set(p.relative_to(REPO).parts))]
    calls = [(p, c) for p in files for c in _argparse_calls(p)]
    assert len(calls) >= 3  # the benchmarks' one parser (benchmarks/timing.py) is found, and the launcher's two
    lax = [f"{p.relative_to(REPO)}:{c.lineno}" for p, c in calls
           if not any(k.arg == "allow_abbrev" and getattr(k.value, "value", None) is False for k in c.keywords)]
    assert lax == []


def test_a_truncated_flag_is_refused_in_one_line(tmp_path):
    """`--shot 4` once ran the whole default sweep as `--shots 4` (minutes); now it is one line and exit 2."""
    from tests.launcher.test_cli_errors import evalm, one_line_error

    proc = evalm("eval", "icl", "--task", "synthetic", "--shot", "4", "--out", str(tmp_path / "out"))
    line = one_line_error(proc)
    assert "--shot" in line and "unrecognized" in line, line
    assert not (tmp_path / "out").exists()
