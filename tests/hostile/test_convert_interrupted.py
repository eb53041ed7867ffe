"""`evalm convert` writes a whole model or none (issue "Hostile inputs, third round", item 7).

    python -m pytest tests/hostile/test_convert_interrupted.py -q

A convert killed before its tokenizer was written left config.json and the weights in `--out`, no
marker saying it was incomplete: the next evaluation of the folder was a `bug:` line. Now the model
is written into a hidden staging folder inside `--out` and moved into place complete, config.json
last. Here a real SIGKILL ends a convert at the moment it starts writing the tokenizer (the
conversion's own process kills itself there, so the point is exact); the folder then holds no model
file, an evaluation of it says so in one line, and the next convert writes it whole.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.hostile.conftest import REPO, one_line
from tests.hostile.hf_folders import llama
from tests.models import two_label_task

pytest.importorskip("transformers")

KILLED_AT_THE_TOKENIZER = """
import os, signal, sys
import transformers
from evalm.train.convert import main

def killed(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)  # the process dies here, as under `kill -9` or the OOM killer

transformers.PreTrainedTokenizerBase.save_pretrained = killed
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow  # ~14 s on 2 cores
def test_a_convert_killed_before_its_tokenizer_leaves_no_model_and_the_next_one_is_whole(tmp_path, capsys):
    source, out = llama(tmp_path / "llama"), tmp_path / "eva"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", KILLED_AT_THE_TOKENIZER, "--hf-model", str(source), "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    visible = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    assert visible == [], visible  # was: config.json and model.safetensors, and no tokenizer
    from evalm.icl_eval.cli import main as evaluate

    code = evaluate(["icl", "--hf-model", str(out), "--task", str(two_label_task(tmp_path / "task")), "--shots", "0",
                     "--seeds", "1", "--methods", "concat", "--out", str(tmp_path / "icl")])
    assert code == 2  # was: a bug line (exit 1)
    assert f"{out / 'config.json'}: not found" in one_line(capsys.readouterr().err)
    from evalm.train.convert import main as convert

    assert convert(["--hf-model", str(source), "--out", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "convert.json", "modeling_eva_llama.py"} <= names
    assert not [n for n in names if n.startswith(".staging-")]  # the killed process's staging folder is gone
    from evalm.icl_eval.models.hf import load_hf

    assert load_hf(out).tokenizer.vocab_size == 64
