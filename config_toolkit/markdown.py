"""Markdown tables, the one writer every floor prints them with: a header and rows of cells.

The tables themselves are their owners' (a study's and a run's: icl_eval/tables.py; the GPU run's:
launcher/gpu_tables.py; the main job's summary: launcher/summary.py; the attention probe's: train/attention_probe.py);
how a table is spelled is written here once.
"""

from __future__ import annotations

from collections.abc import Sequence


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """`| a | b |`, a rule, then one line per row (an empty cell is one space: `| chance | | 0.5 |`)."""
    def line(cells: Sequence[str]) -> str:
        return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"

    return "\n".join([line(header), "|---" * len(header) + "|", *(line(r) for r in rows)])
