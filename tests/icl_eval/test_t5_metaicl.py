"""MetaICL meta-training of T5 (train/metaicl.py) and `evalm eval icl --hf-model T5DIR` end to end.

Run: python -m pytest tests/icl_eval/test_t5_metaicl.py -q
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

import evalm.train.metaicl as metaicl
from evalm.icl_eval.methods.decoder import METHODS, MethodOptions
from evalm.icl_eval.tasks.prompts import PromptBuilder
from evalm.icl_eval.tasks.synthetic import SyntheticConfig, synthetic_task
from evalm.icl_eval.models.t5 import tiny_t5
from tests.icl_eval.test_t5 import one_thread  # noqa: F401 (autouse: one torch thread)

pytest.importorskip("transformers")


@pytest.mark.parametrize("kind,method", [("full", "concat"), ("saicl", "saicl"), ("fid", "fid")])
def test_training_loss_is_the_evaluation_score_of_the_gold_answer(kind, method):
    """Meta-training sees exactly the prompt the evaluator scores: the episode's loss is minus the mean
    log-probability (answer tokens and end token) that the method gives the gold candidate."""
    lm = tiny_t5(dtype=torch.float64, init_std=0.3)
    syn = SyntheticConfig()
    prompt = PromptBuilder(synthetic_task(syn), lm.tokenizer)
    rows = metaicl.episodes(random.Random(5), syn, 7)
    demos, tests, targets = metaicl.make_batch(lm, prompt, syn, random.Random(5), 6, 1)
    with torch.no_grad():
        loss = float(metaicl.loss_on(lm, kind, "none", demos, tests, targets))
    item = prompt.test_item(6, rows[6], 6)
    scores = METHODS[method](lm, prompt, [prompt.demo(i, r) for i, r in enumerate(rows[:6])], [item],
                             MethodOptions(scoring="instance-mean")).scores[0]
    assert abs(loss + scores[item.gold]) <= 1e-10
    assert abs(loss + scores[1 - item.gold]) > 1e-6  # the other candidate is a different target


def test_meta_training_lowers_the_held_out_loss_for_every_encoder():
    syn = SyntheticConfig()
    model_cfg, cfg, optim, _ = metaicl.load_configs(metaicl.DEFAULT_CONFIG, ["metaicl.steps=40", "metaicl.log_every=40",
                                                                            "metaicl.train_k=8"])
    for kind in ("full", "saicl", "fid"):
        cfg_k = type(cfg)(**{**cfg.__dict__, "encoder": kind})
        before = metaicl.build_lm(model_cfg, cfg.seed)
        prompt = PromptBuilder(synthetic_task(syn), before.tokenizer)
        batch = metaicl.make_batch(before, prompt, syn, random.Random(7), 8, 32)  # rules of another stream
        with torch.no_grad():
            start = float(metaicl.loss_on(before, kind, "none", *batch))
        after, records = metaicl.train(model_cfg, cfg_k, optim, syn)
        with torch.no_grad():
            end = float(metaicl.loss_on(after, kind, "none", *batch))
        assert end < 0.5 * start, (kind, start, end)
        assert records[-1]["step"] == 40


def test_evalm_eval_icl_runs_the_four_methods_on_a_meta_trained_t5_folder(tmp_path):
    from evalm.icl_eval.cli import main as eval_main

    folder = tmp_path / "t5"
    assert metaicl.main(["--out", str(folder), "--metaicl.steps=2", "--metaicl.log_every=1",
                         "--metaicl.encoder=fid"]) == 0
    assert json.loads((folder / "metaicl.json").read_text())["metaicl"]["encoder"] == "fid"
    out = tmp_path / "eval"
    rc = eval_main(["icl", "--hf-model", str(folder), "--tokenizer", "bytes", "--methods",
                    "concat,saicl,fid,ensemble", "--shots", "0,2", "--seeds", "1", "--out", str(out),
                    "--eval.test_items=4"])
    assert rc == 0
    results = json.loads((out / "results.json").read_text())
    assert results["protocol"]["model"]["kind"] == "t5"
    assert set(results["summary"]["test"]) == {"concat", "saicl", "fid", "ensemble"}
    acc = [results["summary"]["test"][m]["2"]["accuracy_mean"] for m in ("concat", "saicl", "fid", "ensemble")]
    assert all(0.0 <= a <= 1.0 for a in acc) and np.isfinite(acc).all()
    assert (out / "accuracy_vs_shots.png").is_file()


def test_a_config_error_is_one_line_without_a_traceback(tmp_path, capsys):
    assert metaicl.main(["--out", str(tmp_path / "x"), "--metaicl.encoder=sparse"]) == 2
    err = capsys.readouterr().err
    assert "metaicl" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
