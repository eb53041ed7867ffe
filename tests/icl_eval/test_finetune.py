"""`--methods finetune`: a copy of the model trained on exactly the draw's ICL demonstrations, scored with
0 shots, beside the ICL methods in one run (icl_eval/methods/finetune.py).

Run: python -m pytest tests/icl_eval/test_finetune.py -q
"""

from __future__ import annotations

import json

import pytest
import torch

from evalm.config_toolkit import ConfigError
from evalm.icl_eval.config import EvalConfig
from evalm.icl_eval.methods.decoder import METHODS
from evalm.icl_eval.methods.finetune import IGNORE, SCHEDULE, training_rows, zero_shot
from evalm.icl_eval.methods.options import MethodOptions
from evalm.icl_eval.protocol.runner import Runner
from evalm.icl_eval.tasks.data import SeedSplits
from evalm.icl_eval.tasks.prompts import PromptBuilder
from evalm.icl_eval.tasks.synthetic import SyntheticConfig, episode, synthetic_task
from evalm.icl_eval.tasks.task import Task
from evalm.text.tokenizer import ByteTokenizer
from tests.icl_eval.conftest import save_tiny_gpt2, tiny_evalm

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/icl_eval/conftest.py

SYN = SyntheticConfig()


def _runner(lm=None, **fields) -> Runner:
    config = EvalConfig(**{"methods": ("incremental", "finetune"), "shots": (0, 4, 8), "seeds": (1, 2),
                           "test_items": 6, **fields})
    return Runner(lm or tiny_evalm("eva"), synthetic_task(SYN), config, MethodOptions(),
                  SeedSplits(lambda seed: episode(seed, SYN), False))


def _by(records, method):
    return {(r["seed"], r["shots"]): r for r in records if r["method"] == method}


def test_fine_tunes_on_exactly_the_icl_demonstrations_of_each_draw():
    """Per draw and N the ids the trainer actually pulled (`trained_ids`, counted by its batches) are the
    ICL record's demo_ids, each seen as often as the fixed schedule says; 0 shots trains nothing."""
    records = _runner().run()
    icl, ft = _by(records, "incremental"), _by(records, "finetune")
    assert icl.keys() == ft.keys()
    for key, r in ft.items():
        assert r["demo_ids"] == icl[key]["demo_ids"]
        n = key[1]
        if not n:
            assert r["trained_ids"] == [] and r["train_flops"] == 0.0
            assert r["correct"] == icl[key]["correct"]  # the untouched model at 0 shots is the 0-shot cell
            continue
        assert r["trained_ids"] == sorted(icl[key]["demo_ids"]) and len(r["trained_ids"]) == n
        sched = SCHEDULE["full"]
        assert r["train_steps"] == sched.steps(n) and r["train_passes"] == sched.steps(n) * sched.batch_size(n)
    seeds = {k[0]: r["trained_ids"] for k, r in ft.items() if k[1] == 8}
    assert seeds[1] != seeds[2]  # each draw trains on its own demonstrations


def test_the_tuned_model_does_not_depend_on_the_test_items():
    """No test item leaks into training: the same demonstrations with two disjoint sets of test items, one
    of them the training rows themselves with flipped labels (what a leak would teach), give the same
    training losses and the same scores on a probe item scored in both calls."""
    prompt = PromptBuilder(synthetic_task(SYN), ByteTokenizer())
    splits = episode(3, SYN)
    demos = [prompt.demo(i, splits["train"][i]) for i in range(8)]
    probe = prompt.test_item(0, splits["test"][0], 8)
    others = [prompt.test_item(i, splits["test"][i], 8) for i in range(1, 5)]
    flipped = [prompt.test_item(100 + i, splits["train"][i], 8, gold=(prompt.task.gold(splits["train"][i]) + 1) % 4)
               for i in range(8)]
    lm = tiny_evalm("eva")
    a = METHODS["finetune"](lm, prompt, demos, [probe, *others], MethodOptions())
    b = METHODS["finetune"](lm, prompt, demos, [probe, *flipped], MethodOptions())
    assert a.info["train_loss_last"] == b.info["train_loss_last"] and a.info["train_tokens"] == b.info["train_tokens"]
    assert a.scores[0] == b.scores[0]
    assert a.info["trained_ids"] == sorted(d.item_id for d in demos)


def test_the_schedule_is_deterministic_and_leaves_the_model_untouched():
    """Two runs of the same grid give identical records (scores, losses); the model the ICL methods
    score is the same before and after (the fine-tune works on a copy)."""
    lm = tiny_evalm("full")
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    one, two = _runner(lm).run(), _runner(lm).run()
    drop = ("seconds", "seconds_per_item", "marginal_seconds_per_item", "train_seconds", "encode_seconds")
    assert [{k: v for k, v in r.items() if k not in drop} for r in one] == \
           [{k: v for k, v in r.items() if k not in drop} for r in two]
    assert all(torch.equal(before[k], v) for k, v in lm.model.state_dict().items())
    ft = [r for r in one if r["method"] == "finetune" and r["shots"]]
    assert all(r["train_loss_last"] != r["train_loss_first"] for r in ft)  # it did train


def test_answer_only_loss_on_the_zero_shot_layout():
    """Each training row is [bos] I(x, y) up to the answer, the targets exactly the answer's tokens (under
    the draw's label spelling); a test item re-led for 0 shots is the 0-shot item."""
    task = Task("toy", "Text: {text} Label: {label}", ("no", "yes"))
    prompt = PromptBuilder(task, ByteTokenizer())
    rows = [{"text": "good film", "label": 1}, {"text": "bad", "label": 0}]
    demos = [prompt.demo(i, r) for i, r in enumerate(rows)]
    for (tokens, targets), row in zip(training_rows(prompt, demos), rows):
        assert bytes(tokens[len(prompt.bos):]).decode() == f"Text: {row['text']} Label: {task.labels[row['label']]}"
        shown = [t for t in targets if t != IGNORE]
        assert bytes(shown).decode() == " " + task.labels[row["label"]]
        assert targets[-len(shown) - 1:-1] == shown and targets[-1] == IGNORE  # predicted one position early
    assert zero_shot(prompt.test_item(5, rows[0], 7), prompt.lead(0)) == prompt.test_item(5, rows[0], 0)


def test_hf_model_full_and_lora(tmp_path):
    """A transformers causal LM trains too, fully or through LoRA adapters (merged back), and only LoRA's
    adapters are trained in lora mode."""
    pytest.importorskip("peft")
    from evalm.icl_eval.models.hf import load_hf

    lm = load_hf(save_tiny_gpt2(tmp_path / "gpt2"), tokenizer=ByteTokenizer(), attn_implementation="eager")
    prompt = PromptBuilder(synthetic_task(SYN), ByteTokenizer())
    splits = episode(1, SYN)
    demos = [prompt.demo(i, splits["train"][i]) for i in range(4)]
    items = [prompt.test_item(i, splits["test"][i], 4) for i in range(3)]
    base = METHODS["incremental"](lm, prompt, [], [zero_shot(it, prompt.lead(0)) for it in items], MethodOptions())
    for mode in ("full", "lora"):
        out = METHODS["finetune"](lm, prompt, demos, items, MethodOptions(finetune=mode))
        assert out.info["trained_ids"] == [0, 1, 2, 3] and out.scores != base.scores
        assert (out.info["trained_params"] < out.info["n_params"]) == (mode == "lora")
    again = METHODS["incremental"](lm, prompt, [], [zero_shot(it, prompt.lead(0)) for it in items], MethodOptions())
    assert again.scores == base.scores


def test_refusals_are_one_line(tmp_path, capsys):
    """N above the training pool, a model without a language-model head, Top-k selection and calibration
    are each one line (exit 2 on the command line), never a traceback."""
    from evalm.icl_eval.cli import main

    quick = ["--synthetic.train_steps=2", "--methods", "incremental,finetune", "--seeds", "1", "--test-items", "3"]
    assert main(["icl", "--out", str(tmp_path / "a"), "--shots", "0,600", *quick]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--shots 600" in err[0] and "Traceback" not in err[0]
    assert main(["icl", "--out", str(tmp_path / "b"), "--shots", "2", "--eval.selection=topk", *quick]) == 2
    assert "selection = topk" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="calibration"):
        _runner(calibration="contextual")

    import transformers

    from evalm.icl_eval.models.hf import HFCausalLM

    headless = HFCausalLM(transformers.GPT2Model(transformers.GPT2Config(vocab_size=257, n_embd=8, n_layer=1,
                                                                         n_head=2)), ByteTokenizer())
    prompt = PromptBuilder(synthetic_task(SYN), ByteTokenizer())
    demos = [prompt.demo(0, episode(1, SYN)["train"][0])]
    with pytest.raises(ConfigError, match="no trainable output head") as caught:
        METHODS["finetune"](headless, prompt, demos, [], MethodOptions())
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="no trainable output head"):  # before the ICL methods score anything
        _runner(headless)
    _runner(headless, methods=("incremental",))  # without finetune the same model is scored as before


def test_cli_writes_both_side_by_side_and_resumes(tmp_path, capsys):
    """The tiny end-to-end run: results.json has ICL and fine-tuning per N with the paired difference, the
    first N beating the best baseline and the compute of each, and the printed summary says them; a rerun
    resumes every unit unchanged."""
    from evalm.icl_eval.cli import main

    argv = ["icl", "--out", str(tmp_path / "run"), "--synthetic.train_steps=5", "--methods", "incremental,finetune",
            "--shots", "0,4", "--seeds", "1,2", "--test-items", "6"]
    assert main(argv) == 0
    first = json.loads((tmp_path / "run" / "results.json").read_text())
    side = first["summary"]["finetune_vs_icl"]
    assert side["icl_method"] == "incremental" and set(side["per_n"]) == {"0", "4"}
    four = side["per_n"]["4"]
    assert four["finetune_minus_icl"]["ci95"][0] <= four["finetune_minus_icl"]["mean"] <= four["finetune_minus_icl"]["ci95"][1]
    assert four["compute"]["finetune"]["train_flops"] > 0 and four["compute"]["icl"]["encode_flops"] > 0
    assert set(side["first_beats_best_baseline"]) == {"incremental", "finetune"}
    printed = capsys.readouterr().out
    diff = four["finetune_minus_icl"]
    assert f"finetune - incremental  0:+0.000 [+0.00, +0.00]  4:{diff['mean']:+.3f} [{diff['ci95'][0]:+.2f}," in printed
    assert "first N above the best label baseline (whole interval): incremental " in printed
    assert main(argv) == 0
    second = json.loads((tmp_path / "run" / "results.json").read_text())
    assert second["records"] == first["records"]


def test_lora_on_an_evalm_model_trains_only_adapters_and_merges():
    """LoRA on an EVALM model: adapters on its linear layers but the head train (far fewer parameters than
    the model), the loss falls, and the merged copy scores differently from the untouched model."""
    pytest.importorskip("peft")
    lm = tiny_evalm("eva")
    prompt = PromptBuilder(synthetic_task(SYN), ByteTokenizer())
    splits = episode(1, SYN)
    demos = [prompt.demo(i, splits["train"][i]) for i in range(8)]
    items = [prompt.test_item(i, splits["test"][i], 8) for i in range(3)]
    out = METHODS["finetune"](lm, prompt, demos, items, MethodOptions(finetune="lora"))
    base = METHODS["finetune"](lm, prompt, [], items, MethodOptions(finetune="lora"))
    assert 0 < out.info["trained_params"] < out.info["n_params"] / 10
    assert out.info["train_loss_last"] < out.info["train_loss_first"] and out.scores != base.scores
    assert out.info["trained_ids"] == list(range(8))
