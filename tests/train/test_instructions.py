"""Instruction rows written by train.instructions read back through its own reader.

Run: python -m pytest tests/train/test_instructions.py -q
"""

from __future__ import annotations

import json

from evalm.train.instructions import MSIT_COLUMNS, ROW_FORMAT, Example, iter_examples, write_examples


def test_written_examples_read_back_unchanged(tmp_path):
    examples = [Example("topic", "News: caf\u00e9 prices rise", "business"), Example("subj", "x\n|||\ny", "objective")]
    path = tmp_path / "instructions" / "train.jsonl"
    assert write_examples(path, examples) == 2
    assert list(iter_examples(path)) == examples
    first = json.loads(path.read_text(encoding="utf-8").splitlines()[0])
    assert list(first) == list(MSIT_COLUMNS.values())
    assert ROW_FORMAT == '{"task", "input", "output"}'
