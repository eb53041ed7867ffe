"""benchmarks/convert.py's reading of perplexity by a token's offset inside EVA's block (not the runs: they
need SmolLM2), against hand-built per-token losses.

    python -m pytest tests/train/test_convert_study.py -q
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks import convert as study


def test_block_offsets_read_each_token_where_it_sits_in_its_block():
    """nll[i] is the token at position i + 1: the first 16 of each 1,024-token block cost ln 10, the rest
    ln 2, and the first block (positions below 1,024, no whole block behind it) ln 1000, which must not show."""
    pos = np.arange(1, 3001)
    nll = np.where(pos < 1024, math.log(1000), np.where(pos % 1024 < 16, math.log(10), math.log(2)))
    got = study.by_block_offset(nll)
    assert got == pytest.approx({"[0, 16)": 10.0, "[16, 64)": 2.0, "[64, 256)": 2.0, "[256, 1024)": 2.0})
    shifted = study.by_block_offset(np.roll(nll, 1))  # one position off: position 1,024 (offset 0) now costs ln 1000
    assert shifted["[0, 16)"] > 10.5


def test_recall_at_other_lengths_has_its_own_run_folder(tmp_path):
    """The study's grid keeps ROOT/recall/MODEL; a first pass at fewer lengths gets a folder of its own (a
    folder holds one grid), and the lengths reach `evalm eval recall` once."""
    cmd, out = study.eval_command(tmp_path, "eva-rope-0", "recall")
    assert out == tmp_path / "recall" / "eva-rope-0"
    assert cmd[cmd.index("--lengths") + 1] == "1024,4096,16384" and cmd.count("--lengths") == 1
    cmd, out = study.eval_command(tmp_path, "eva-rope-0", "recall", "1024,4096")
    assert out == tmp_path / "recall" / "eva-rope-0-1024-4096"
    assert cmd[cmd.index("--lengths") + 1] == "1024,4096" and cmd[cmd.index("--out") + 1] == str(out)
    cmd, out = study.eval_command(tmp_path, "original", "icl", "1024,4096")  # icl has no lengths: one folder
    assert out == tmp_path / "icl" / "original" and "--lengths" not in cmd
