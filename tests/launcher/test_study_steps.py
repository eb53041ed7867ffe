"""The shipped studies resolve to the same commands under the one runner as under the study runner before it.

    pytest tests/launcher/test_study_steps.py

data/study_steps.json holds every step of configs/study-{convert,recall,summaries}.toml (name, argv with
ROOT = /ROOT, needs) as `load_study` resolved them before the study steps became units of
`launcher.runner`, with the changes made beside it: `evalm study ...` steps in the spellings of the
commands that own them (`convert --prepare`, `train uptrain --export-trainables --run`, ...), the
conversion study's perplexity and sink steps (once a benchmark script's), the summaries study's
report as its `[summary]` instead of a step, the recall study's selection steps, added after its 24, and the
conversion study's selection steps, added after its `recall-original-32768-65536` (the window-bound ones after
`recall-sinkwin-bound-only-own-k8-8k`, the perplexity ones with selection after those). `--resume auto`, on every
training step of `evalm train uptrain` (a step stopped by SIGTERM resumes from its last checkpoint instead of refusing its own
folder), is checked apart, below.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalm.launcher.study_file import load_study

BEFORE = json.loads((Path(__file__).parent / "data" / "study_steps.json").read_text())


def uptrain(argv: list[str]) -> bool:
    """A training step of `evalm train uptrain` (not its --export-trainables / --rebuild, which train nothing)."""
    return argv[:2] == ["train", "uptrain"] and not {"--export-trainables", "--rebuild"} & set(argv)


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_every_shipped_study_resolves_to_the_same_commands(name):
    steps = load_study(f"configs/study-{name}.toml", root="/ROOT").steps
    now = [{"name": s.name, "argv": s.argv[:-2] if uptrain(s.argv) else s.argv, "needs": list(s.needs)} for s in steps]
    assert now == BEFORE[name]


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_every_shipped_uptrain_step_resumes(name):
    """`evalm train uptrain` without `--resume` refuses a folder with checkpoints: a study step stopped by
    SIGTERM (a preempted GPU job) could not go on."""
    steps = [s for s in load_study(f"configs/study-{name}.toml").steps if uptrain(s.argv)]
    assert all(s.argv[-2:] == ["--resume", "auto"] for s in steps), [s.name for s in steps]
    assert len(steps) == {"convert": 5, "recall": 0, "summaries": 3}[name]
