"""The house rules a reader meets first, measured on the text: the README is a front page, nothing
points where a reader cannot go (a tracker number, a design document that does not ship), kernels
use named helpers rather than assigned lambdas, the file map lists every module, and the README's
commands are the commands `evalm --help` has."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

from tests.test_house import FOLDERS, ROOT, modules

README = ROOT / "README.md"
MAX_README_LINES, MAX_LINE_CHARS = 200, 200
TRACKER = re.compile(r"\b[Ii]ssues? #?\d+\b")
OUTSIDE = re.compile(r"\b(?:EVA_SPEC|ICL_SPEC|DATA_SPEC)\b|\bARCHITECTURE\.md\b|\bSTYLE\.md\b")


def shipped_text_files() -> list[Path]:
    """Every tracked source, config and doc file (tests included)."""
    listed = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.toml", "*.sh"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.split()
    return [ROOT / f for f in listed if (ROOT / f).is_file()]


def outside_code_blocks(text: str) -> list[tuple[int, str]]:
    lines, inside = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            inside = not inside
        elif not inside:
            lines.append((number, line))
    return lines


def test_the_readme_is_a_front_page():
    text = README.read_text(encoding="utf-8")
    assert text.count("\n") <= MAX_README_LINES
    wide = [n for n, line in outside_code_blocks(text) if len(line) > MAX_LINE_CHARS]
    assert wide == [], f"README lines over {MAX_LINE_CHARS} characters: {wide}"


def test_nothing_cites_a_tracker_number_or_a_document_that_does_not_ship():
    found = []
    for path in shipped_text_files():
        if path == Path(__file__):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if TRACKER.search(line) or OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert found == []


def test_no_assigned_lambdas():
    found = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Lambda):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == [], "name the function with def instead"


def test_the_file_map_lists_every_module():
    layout = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    missing = sorted(str(path.relative_to(ROOT)) for path in modules().values()
                     if path.name != "__init__.py" and str(path.relative_to(ROOT)) not in layout)
    assert missing == [], "add a line for each to docs/layout.md"
    assert set(FOLDERS) <= {line.split("/")[0] for line in layout.splitlines() if "/" in line.split(" ")[0]}


def test_the_readme_and_evalm_help_agree_on_every_command():
    from evalm.launcher.cli import COMMANDS
    from evalm.data_pipeline.cli import DISPATCHER as DATA
    from evalm.icl_eval.cli import COMMANDS as EVAL
    from evalm.train.cli import COMMANDS as TRAIN

    groups = {"data": set(DATA.commands), "train": set(TRAIN), "eval": set(EVAL)}
    text = README.read_text(encoding="utf-8")
    used = re.findall(r"(?<![\w-])evalm (\w[\w-]*)(?: (\w[\w-]*))?", text)
    used = [(a, b) for a, b in used if a != "import" and not a.isupper()]  # code (`from evalm import`), placeholders
    unknown = sorted({f"{a} {b}".strip() for a, b in used if a not in COMMANDS
                      or (a in groups and b and not b.isupper() and b not in groups[a])})
    assert unknown == [], f"the README names commands `evalm --help` does not have: {unknown}"
    assert all(f"evalm {name}" in text for name in COMMANDS), "every command of `evalm --help` appears in the README"
