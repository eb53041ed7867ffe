"""Every command line in the README and the guides is one the code has: `evalm` commands and
subcommands exist, every `--flag` they use is an option of that command (or an override), every
`python -m` / `torchrun -m` module resolves, and every `python benchmarks/X.py` exists with its flags.

This is the fast first check (a renamed flag or command fails here, in the line that names it). That
every such line also RUNS is the contract of tests/test_doc_lines.py: each line (as
tests.doc_lines.command_lines() reads it) is run there from the docs' own text with only declared
edits and stand-in inputs, or by the test that owns it (the paper-scale block:
tests/test_paper_chain.py; the main job: tests/launcher/test_run.py; the test command:
.ci/run), or is excused there with its reason; a line none of them runs fails there, named.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from tests.doc_lines import command_lines

ROOT = Path(__file__).resolve().parent.parent


@cache
def help_text(words: tuple[str, ...]) -> str:
    """`evalm WORDS --help`, in this process."""
    from evalm.launcher.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main([*words, "--help"])
    return out.getvalue()


def _evalm(argv: list[str]) -> list[str]:
    from evalm.launcher.cli import COMMANDS

    problems = []
    if argv[0] not in COMMANDS:
        return [f"no command `evalm {argv[0]}`"]
    words = tuple(argv[:2]) if argv[0] in ("data", "train", "eval", "study") and len(argv) > 1 else tuple(argv[:1])
    text = help_text(words)
    if words[-1] not in ("run", "export") and f"usage: evalm {' '.join(words)}" not in text:
        return [f"no command `evalm {' '.join(words)}`"]
    for arg in argv[len(words):]:
        flag = arg.split("=", 1)[0]
        if flag.startswith("--") and "." not in flag and flag not in text:
            problems.append(f"`evalm {' '.join(words)}` has no option {flag}")
    return problems


def _module(argv: list[str]) -> list[str]:
    module = argv[argv.index("-m") + 1]
    return [] if importlib.util.find_spec(module) else [f"no module {module}"]


def _script(argv: list[str]) -> list[str]:
    script = ROOT / argv[1]
    if not script.is_file():
        return [f"no file {argv[1]}"]
    text = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120).stdout
    return [f"{argv[1]} has no option {a.split('=')[0]}" for a in argv[2:]
            if a.startswith("--") and a.split("=")[0] not in text]


def check(argv: list[str]) -> list[str]:
    if argv[0] == "evalm":
        return _evalm(argv[1:])
    if "-m" in argv:
        return _module(argv)
    if argv[0].startswith("python") and len(argv) > 1 and argv[1].endswith(".py"):
        return _script(argv)
    return []


@pytest.mark.parametrize("where, line", command_lines())
def test_every_documented_command_exists_with_its_flags(where, line):
    assert check(shlex.split(line)) == [], f"{where}: {line}"


def test_the_check_catches_a_renamed_flag_or_command():
    assert check(shlex.split("evalm eval icl --shotz 1")) == ["`evalm eval icl` has no option --shotz"]
    assert check(shlex.split("evalm train pretraining --config x")) == ["no command `evalm train pretraining`"]
    assert check(shlex.split("torchrun --nproc_per_node=2 -m evalm.train.pretrained")) == ["no module evalm.train.pretrained"]
