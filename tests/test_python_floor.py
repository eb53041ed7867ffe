"""The oldest Python the project declares (`requires-python`) is one it runs on.

A floor that is lower than the code needs installs fine and then fails at the first import (the
project once declared 3.10 while importing `tomllib`, new in 3.11). Two independent checks, both
run against the declared floor rather than the interpreter running the tests:
- every source file parses with the floor's grammar (`ast.parse(feature_version=...)`);
- every standard-library module the source imports exists in an interpreter of the floor's
  version, asked in a subprocess (`python3.X -I`, no site-packages, so only its stdlib answers).
The second is skipped only where no interpreter of the floor's version is on PATH (the CI image
has one: its python3 is the floor).

Run: python -m pytest tests/test_python_floor.py -q
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.test_house import modules

ROOT = Path(__file__).resolve().parent.parent
REQUIRES = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["requires-python"]


def declared_floor() -> tuple[int, int]:
    match = re.fullmatch(r">=\s*3\.(\d+)", REQUIRES.strip())
    assert match, f"requires-python {REQUIRES!r}: expected a plain floor, '>=3.N'"
    return 3, int(match.group(1))


def stdlib_imports() -> set[str]:
    """Top-level standard-library names imported anywhere in the packages (also inside functions)."""
    names = set()
    for path in modules().values():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names & set(sys.stdlib_module_names)


def test_the_running_python_meets_the_floor():
    assert sys.version_info[:2] >= declared_floor()


@pytest.mark.parametrize("name", sorted(modules()))
def test_every_module_parses_with_the_floors_grammar(name):
    path = modules()[name]
    ast.parse(path.read_text(encoding="utf-8"), filename=str(path), feature_version=declared_floor())


def test_every_stdlib_module_imported_exists_at_the_floor():
    major, minor = declared_floor()
    python = shutil.which(f"python{major}.{minor}")
    if python is None:
        pytest.skip(f"no python{major}.{minor} on PATH to ask")
    wanted = sorted(stdlib_imports())
    probe = ("import importlib.util, json, sys; "
             "print(json.dumps([n for n in json.loads(sys.argv[1]) if importlib.util.find_spec(n) is None]))")
    env = {**os.environ, "PYENV_VERSION": f"{major}.{minor}"}  # a pyenv shim starts that version, else ignored
    out = subprocess.run([python, "-I", "-c", probe, json.dumps(wanted)], capture_output=True, text=True,
                         timeout=60, env=env)
    if out.returncode != 0:
        pytest.skip(f"python{major}.{minor} on PATH does not start: {out.stderr.strip()[:200]}")
    missing = json.loads(out.stdout)
    assert not missing, (f"requires-python {REQUIRES!r}, but Python {major}.{minor} has no {missing}: "
                         "raise the floor or give those imports a fallback")
