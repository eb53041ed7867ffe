"""The command lines of the README and the guides, as the tests that check and run them read them.

A command line is one command of a ```bash block: continuation lines joined, comments dropped,
`VAR=value` prefixes and shell glue (`&&`, `||`, `|`, `;`, `&`, `for ...; do`) split off, kept when
it starts with `evalm`, `python`/`python3` (not `-c`), `torchrun` or `srun`.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"(evalm|python3?|torchrun|srun)\b")


def commands_of(line: str) -> list[str]:
    """The commands of one joined shell line, comment dropped."""
    line = line.split("  #")[0].split(" # ")[0].strip()
    found = []
    for part in re.split(r"\s+(?:&&|\|\||\|)\s+|\s*;\s*|\s+&(?:\s+|$)", line):
        part = re.sub(r"^(?:do|then)\s+", "", part.strip())
        part = re.sub(r"^(?:[A-Z_]+=\S+\s+)+", "", part)  # VAR=value prefixes
        if COMMAND.match(part) and not re.match(r"python3? -c", part):
            found.append(part)
    return found


def command_lines(docs: list[Path] = DOCS) -> list[tuple[str, str]]:
    """(file name, command) for each command of each ```bash block, in document order."""
    found = []
    for path in docs:
        text = path.read_text(encoding="utf-8")
        for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
            for line in block.replace("\\\n", " ").splitlines():
                found += [(path.name, part) for part in commands_of(line)]
    return found
