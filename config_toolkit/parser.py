"""The argparse of every command: an error is one line naming the flag, never a usage block."""

from __future__ import annotations

import argparse
import textwrap


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions keep their line breaks (a docstring's examples stay as written); only a line wider
    than the terminal is wrapped, so a one-paragraph description still reads as a paragraph."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        lines = []
        for line in text.splitlines():
            if len(indent + line) <= width:
                lines.append(indent + line)
                continue
            lead = indent + line[: len(line) - len(line.lstrip())]
            lines.append(textwrap.fill(line.strip(), width, initial_indent=lead, subsequent_indent=lead))
        return "\n".join(lines)


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line naming the flag (no usage block), descriptions kept as written,
    and no abbreviated flags: with argparse's prefix matching a typo such as `--shot 4` would be taken
    as `--shots 4` and start a long job; only a flag's full name is read."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Formatter)
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
