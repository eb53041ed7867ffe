"""A tiny model trained here learns the synthetic family in context; the CLI writes its reports.

Run: python -m pytest tests/icl_eval/test_synthetic_cli.py -q
"""

from __future__ import annotations

import json

import pytest
import torch

from evalm import EvalmModel, ModelConfig
from evalm.text.tokenizer import ByteTokenizer
from evalm.icl_eval.config import EvalConfig
from evalm.icl_eval.models.lm import EvalmLM
from evalm.icl_eval.methods.decoder import MethodOptions
from evalm.icl_eval.protocol.runner import Runner
from evalm.icl_eval.tasks.data import SeedSplits
from evalm.icl_eval.stats.summary import summarize
from evalm.icl_eval.tasks.synthetic import SyntheticConfig, episode, synthetic_task, train_tiny_model


# ~38 s on 2 cores; the main job's test (tests/launcher/test_run.py) asserts the same learning in context above every
# label baseline
@pytest.mark.slow
def test_trained_tiny_model_learns_in_context_above_every_label_baseline(one_thread):
    """Recall, not a label prior: on uniform 8-input rules, 32 shots beat the best label baseline
    (chance, test-set majority, in-context majority on the same items) with the whole bootstrap
    interval above zero, and beat 1 shot. Training cycles rule sizes 2/4/8 (the recall circuit forms
    early on small rules, synthetic.instruction_examples)."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=257, d_model=48, n_layer=2, n_head=4, d_ff=128, window_size=16, chunk_size=4,
                      circular_period=256, attention="eva", dropout=0.0, attn_dropout=0.0)
    model = EvalmModel(cfg)
    model.init_weights()
    syn = SyntheticConfig(n_inputs=8, train_inputs=(2, 4, 8), train_steps=300, batch_size=16, train_shots=40, seed=0)
    train_tiny_model(model, syn)
    config = EvalConfig(task="synthetic", methods=("incremental",), shots=(1, 32), seeds=(11, 12))
    runner = Runner(EvalmLM(model, ByteTokenizer()), synthetic_task(syn), config, MethodOptions(),
                    SeedSplits(lambda seed: episode(seed, syn), False))
    acc = summarize(runner.run(), runner.baselines)["test"]["incremental"]
    assert len({r["item_set"] for r in runner.records}) == 2  # a fresh episode per seed: nested items
    assert acc["32"]["gain"]["ci95"][0] > 0, acc["32"]
    assert acc["32"]["accuracy_mean"] > acc["1"]["accuracy_mean"] + 0.2


def test_cli_icl_and_ppl_write_reports(tmp_path, one_thread):
    from evalm.icl_eval.cli import main

    out = tmp_path / "icl"
    rc = main(["icl", "--out", str(out), "--shots", "0,2,8", "--seeds", "1,2", "--save-predictions",
               "--methods", "incremental,concat,structured,saicl,ensemble",
               "--synthetic.train_steps=5", "--eval.test_items=6", "--eval.choose_shot_on_validation=true",
               "--eval.validation_items=20", "--eval.method.group_tokens=16"])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["protocol"]["scoring"] == "instance-sum" and res["protocol"]["model"]["tokenizer"]
    rec = [r for r in res["records"] if r["method"] == "structured" and r["shots"] == 8][0]
    assert sum(len(g["demo_ids"]) for g in rec["groups"]) == 8 and rec["n_groups"] >= 2
    assert set(res["summary"]["best_shot"]) == {"incremental", "concat", "structured", "saicl", "ensemble"}
    preds = (out / "predictions.jsonl").read_text().splitlines()
    assert len(preds) == 5 * 3 * 2 * 6 * 2 and len(json.loads(preds[0])["scores"]) == 4  # 4 labels
    assert (out / "accuracy_vs_shots.png").stat().st_size > 1000
    assert (out / "time_per_item_vs_shots.png").stat().st_size > 1000

    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "b1.txt").write_text("It was the best of times. " * 50)  # 1,300 bytes: reaches 1024
    rc = main(["ppl", "--out", str(tmp_path / "ppl"), "--books", str(tmp_path / "books"), "--lengths", "64,256,1024",
               "--synthetic.train_steps=2", "--ppl.segment_tokens=128"])
    assert rc == 0
    ppl = json.loads((tmp_path / "ppl" / "results.json").read_text())
    assert ppl["protocols"]["cached"]["buckets"][0]["books"] == 1
    assert (tmp_path / "ppl" / "perplexity_vs_length.png").is_file()


def test_cli_unknown_key_is_a_clear_error(tmp_path, capsys):
    from evalm.icl_eval.cli import main

    assert main(["icl", "--out", str(tmp_path), "--eval.nope=1"]) == 2
    assert "nope" in capsys.readouterr().err
