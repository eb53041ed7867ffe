"""House rules of the command table: no grab-bag command, earlier spellings that only forward, and a study's
report that reads what its own file declares.

    python -m pytest tests/test_house_commands.py -q

`evalm study prepare|widen|trainables|rebuild|digest|summary` trained nothing and held logic of its own
beside the commands whose nouns it handled (a conversion, an uptraining run, an export's weights, a study's
report), with one study's stage names in the package. Each now lives in the command that owns its noun;
`evalm study ...` is a table of argv rewrites that scripts keep calling.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALIASES = ROOT / "launcher" / "study_aliases.py"
PACKAGE = ("evalm", "config_toolkit", "data_pipeline", "train", "icl_eval", "launcher", "storage", "text")


def test_the_old_study_spellings_only_forward_to_the_commands_that_own_them():
    from evalm.launcher.cli import COMMANDS
    from evalm.launcher.study_aliases import ALIASES as TABLE

    assert not (ROOT / "train" / "study.py").exists() and not (ROOT / "train" / "study_summary.py").exists()
    tree = ast.parse(ALIASES.read_text(encoding="utf-8"))
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assert set(functions) == {"forwarded", "forward"}, "argv rewriting and a dispatch, nothing else"
    calls = {ast.unparse(n.func) for n in ast.walk(functions["forward"]) if isinstance(n, ast.Call)}
    assert calls == {"forwarded", "COMMANDS[new[0]][1]"}  # the new spelling, run through evalm's own table
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "collections.abc", "functools", "evalm.config_toolkit", "evalm.launcher.cli"}
    for name, (_, target) in TABLE.items():
        assert target[0] in COMMANDS and target[0] != "study", name
    from evalm.launcher.commands import COMMANDS as PACKAGE_COMMANDS

    assert "evalm.launcher.study_aliases" in PACKAGE_COMMANDS["study"][1].__doc__


def test_no_module_of_the_package_names_a_studys_stages():
    """A study's rows and goals are its file's (`[summary]`, launcher/study_report.py): the package held the
    summaries study's stage names (`lora-off`, `eva-0-off`) and goals in code."""
    found = [str(p.relative_to(ROOT)) for folder in PACKAGE for p in sorted((ROOT / folder).rglob("*.py"))
             if any(name in p.read_text(encoding="utf-8") for name in ('"lora-off"', '"eva-0-off"'))]
    assert found == []
