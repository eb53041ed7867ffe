"""The field's many-shot protocols, each against a hand-computed case: token budgets, label remapping,
demonstration order with order seeds (and the draw/order variance split), nearest-demonstration arms.

Byte tokens throughout (one character = one token), so every length below is counted by hand.
Run: python -m pytest tests/icl_eval/test_many_shot_protocols.py -q
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from evalm.icl_eval.stats.baselines import NAMES as BASELINES
from evalm.icl_eval.protocol.budget import BudgetTooSmall, fit
from evalm.icl_eval.config import EvalConfig
from evalm.icl_eval.protocol.label_map import SYMBOLS, mapped_words, remap
from evalm.icl_eval.methods.decoder import MethodOptions
from evalm.icl_eval.protocol.nearest import TooFewDemonstrations, apply, nearest, sample_learning_ratio
from evalm.icl_eval.protocol.order import arrange
from evalm.icl_eval.tasks.prompts import PromptBuilder
from evalm.icl_eval.protocol.runner import Runner
from evalm.icl_eval.tasks.data import SeedSplits
from evalm.icl_eval.stats.spread import order_split
from evalm.icl_eval.tasks.task import Task
from evalm.text.tokenizer import ByteTokenizer
from tests.icl_eval.conftest import tiny_evalm

pytestmark = pytest.mark.usefixtures("one_thread")

TASK = Task("toy", "{text}={label}", ("a", "b", "c"))


def _splits(train_texts, train_labels, test_texts, test_labels):
    return {"train": [{"text": t, "label": y} for t, y in zip(train_texts, train_labels)],
            "test": [{"text": t, "label": y} for t, y in zip(test_texts, test_labels)]}


def _runner(splits, task=TASK, lm=None, **eval_fields) -> Runner:
    config = EvalConfig(task=task.name, methods=("incremental",), **{"seeds": (1,), **eval_fields})
    return Runner(lm or tiny_evalm("full"), task, config, MethodOptions(), SeedSplits(lambda seed: splits, True))


# ---------------------------------------------------------------------------------------------
# token budgets

def test_fit_picks_exactly_the_largest_prefix_that_fits_counted_by_hand():
    prompt = PromptBuilder(TASK, ByteTokenizer())  # bos: 1 token (EVALM's </s>), sep: 1 token ("\n")
    rows = [{"text": t, "label": 0} for t in ("aaaa", "bb", "cccccc", "d")]  # demos "aaaa=a": 6, 4, 8, 3 tokens
    order = [0, 1, 2, 3]

    def demo(i):
        return prompt.demo(i, rows[i])

    # used(k) = bos 1 + test 5 + demos + (k - 1) seps: k=1 -> 12, k=2 -> 17, k=3 -> 26, k=4 -> 30
    assert [fit(prompt, order, demo, 5, b) for b in (12, 16, 17, 25, 26, 29, 30, 99)] == \
        [(1, 12), (1, 12), (2, 17), (2, 17), (3, 26), (3, 26), (4, 30), (4, 30)]
    assert fit(prompt, order, demo, 5, 0) == (0, 0)  # the no-demonstration reference
    with pytest.raises(BudgetTooSmall, match=r"--budgets 11: below one demonstration .* takes 12 tokens"):
        fit(prompt, order, demo, 5, 11)


def test_budget_grid_records_the_largest_fitting_count_per_seed_and_its_tokens():
    texts = ["x" * n for n in (3, 9, 1, 7, 5, 2, 8, 4, 6, 10)]
    splits = _splits(texts, [0, 1, 2, 0, 1, 2, 0, 1, 2, 0], ["yy", "zzzz"], [0, 1])
    runner = _runner(splits, seeds=(1, 2), budgets=(0, 40, 70))
    runner.run()
    prompt = runner.prompt_for(2)
    longest = max(len(c.tokens) for r in splits["test"] for c in prompt.test_item(0, r, 1).candidates)
    from evalm.icl_eval.protocol.selection import dataset_level

    for rec in runner.records:
        if rec["budget"] == 0:
            assert rec["shots"] == 0 and rec["prompt_tokens"] == 0
            continue
        order = dataset_level(10, 10, rec["seed"])
        ctx = [len(prompt.context([prompt.demo(i, splits["train"][i]) for i in order[:k]])) + longest
               for k in range(1, 11)]  # the whole prompt of every prefix, through prompt.context (independent of fit)
        best = max(k for k in range(1, 11) if ctx[k - 1] <= rec["budget"])
        assert rec["shots"] == best and rec["prompt_tokens"] == ctx[best - 1]
        assert rec["demo_ids"] == order[:best]
    summary = runner.results({}, {}, 0.0)["summary"]
    assert summary["axis"] == "budget" and set(summary["test"]["incremental"]) == {"0", "40", "70"}
    cell = summary["test"]["incremental"]["70"]
    assert cell["shots_per_seed"] == [r["shots"] for r in runner.records if r["budget"] == 70]
    assert "vs_0_shots" in cell and set(cell["baselines"]) == {"chance", "test_majority", "in_context_majority"}


# ---------------------------------------------------------------------------------------------
# label remapping

def test_label_maps_by_hand():
    words = ("neg", "neu", "pos")
    ints = mapped_words(words, "int", 1)
    assert sorted(ints) == ["0", "1", "2"] and ints == mapped_words(words, "int", 1)  # seeded per draw
    assert {mapped_words(words, "int", s) for s in range(1, 9)} != {ints}  # another draw, another mapping
    syms = mapped_words(words, "symbols", 1)
    assert len(set(syms)) == 3 and set(syms) <= set(SYMBOLS)
    assert len(set(mapped_words(tuple(map(str, range(77))), "symbols", 1))) == 77  # pairs past 16 labels
    for seed in range(20):
        flipped = mapped_words(words, "flip", seed)
        assert sorted(flipped) == sorted(words) and all(f != w for f, w in zip(flipped, words))
    assert mapped_words(("no", "yes"), "flip", 3) == ("yes", "no")  # Wei et al.'s binary flip
    assert mapped_words(words, "none", 1) == words


def test_a_remap_scores_as_the_hand_written_task_with_the_mapped_words_and_keeps_the_baselines():
    splits = _splits(["ab", "cd", "ef", "gh", "ij", "kl"], [0, 1, 2, 0, 1, 0], ["mn", "op", "qr"], [0, 2, 1])
    lm = tiny_evalm("full")
    mapped = _runner(splits, lm=lm, shots=(0, 3), seeds=(1, 2), label_map="int")
    mapped.run()
    none = _runner(splits, lm=lm, shots=(0, 3), seeds=(1, 2))
    none.run()
    for seed in (1, 2):
        words = mapped_words(TASK.labels, "int", seed)
        assert mapped.label_maps[seed] == dict(zip(TASK.labels, words))
        oracle = _runner(splits, task=Task("toy", TASK.template, words), lm=lm, shots=(0, 3), seeds=(seed,))
        oracle.run()  # a task file whose labels *are* the mapped words: the same prompts, the same scores
        got = [r for r in mapped.records if r["seed"] == seed]
        assert [r["correct"] for r in got] == [r["correct"] for r in oracle.records]
        assert [r["demo_ids"] for r in got] == [r["demo_ids"] for r in oracle.records]
    # the baselines work on label indices, which a remap leaves in place: the same vectors as unmapped
    for b_map, b_none in zip(mapped.baselines, none.baselines):
        assert {k: b_map[k] for k in ("chance", "test_majority", "in_context_majority")} == \
            {k: b_none[k] for k in ("chance", "test_majority", "in_context_majority")}
    item = mapped.prompt_for(2).test_item(0, splits["test"][0], 3)
    assert ByteTokenizer().decode(list(item.candidates[0].tokens)).endswith("=" + mapped_words(TASK.labels, "int", 2)[0])


def test_remap_of_a_multiple_choice_task_is_one_clear_error():
    copa = Task("copa", "{premise} {label}", choice_fields=("c1", "c2"))
    with pytest.raises(ValueError, match=r"--label-map int: task 'copa' is multiple choice .* use --label-map none"):
        remap(copa, "int", 1)


# ---------------------------------------------------------------------------------------------
# order

def test_orders_by_hand():
    labels = {i: i % 3 for i in range(12)}
    ids = [7, 2, 9, 4, 0, 11, 5, 3]
    for seed in (1, 2, 3):
        s = arrange(ids, labels, "label-sorted", seed)
        assert sorted(s) == sorted(ids)
        runs = [labels[i] for k, i in enumerate(s) if k == 0 or labels[s[k - 1]] != labels[i]]
        assert sorted(runs) == sorted(set(labels[i] for i in ids))  # every label in exactly one block
        inter = arrange(ids, labels, "interleaved", seed)
        assert sorted(inter) == sorted(ids) and len({labels[i] for i in inter[:3]}) == 3  # one of each first
    assert arrange(ids, labels, "random", None) == ids  # no order seed: the draw's own order
    shuffled = [arrange(ids, labels, "random", s) for s in (1, 2, 3)]
    assert all(sorted(o) == sorted(ids) for o in shuffled) and len({tuple(o) for o in shuffled}) == 3


def test_order_seeds_rearrange_the_same_draw_and_split_the_spread():
    splits = _splits([f"t{i}" for i in range(12)], [i % 3 for i in range(12)], ["u", "v", "w", "x"], [0, 1, 2, 0])
    runner = _runner(splits, shots=(0, 6), seeds=(1, 2), order_seeds=(5, 6), order=("random", "label-sorted"))
    runner.run()
    six = [r for r in runner.records if r["shots"] == 6]
    for seed in (1, 2):
        mine = [r for r in six if r["seed"] == seed]
        assert len(mine) == 4 and len({tuple(sorted(r["demo_ids"])) for r in mine}) == 1  # one draw, four orders
    assert {tuple(sorted(r["demo_ids"])) for r in six if r["seed"] == 1} != \
        {tuple(sorted(r["demo_ids"])) for r in six if r["seed"] == 2}
    sorted_rows = [r for r in six if r["arm"] == "label-sorted"]
    for r in sorted_rows:
        labs = [i % 3 for i in r["demo_ids"]]
        assert sum(a != b for a, b in zip(labs, labs[1:])) == len(set(labs)) - 1
    summary = runner.results({}, {}, 0.0)["summary"]["test"]
    cell = summary["incremental"]["6"]
    acc = np.array([[np.mean(r["correct"]) for r in six if r["seed"] == s and not r["arm"]] for s in (1, 2)])
    assert cell["order_split"]["accuracy"] == acc.tolist()
    assert cell["order_split"]["order_std"] == pytest.approx(np.sqrt(acc.var(axis=1, ddof=1).mean()))
    assert cell["accuracy_mean"] == pytest.approx(acc.mean()) and cell["n_seeds"] == 2  # orders averaged per draw
    assert "vs_base" in summary["incremental+label-sorted"]["6"]


def test_order_split_against_hand_computed_numbers():
    # draw 1: orders at 0.5 and 0.7; draw 2: 0.2 and 0.4 (10 shared items)
    def vec(n_right):
        return [1] * n_right + [0] * (10 - n_right)

    out = order_split([np.array([vec(5), vec(7)]), np.array([vec(2), vec(4)])], [list(range(10))] * 2)
    assert out["order_std"] == pytest.approx(np.sqrt(0.02))  # var([.5, .7]) = var([.2, .4]) = 0.02
    assert out["draw_std"] == pytest.approx(np.std([0.6, 0.3], ddof=1))
    assert out["order_std_ci95"][0] <= out["order_std"] <= out["order_std_ci95"][1]


# ---------------------------------------------------------------------------------------------
# nearest demonstrations

def test_nearest_modes_by_hand():
    sims = np.array([0.1, 0.9, 0.3, 0.9, 0.5, 0.0])
    ctx = [0, 1, 2, 3, 4]
    assert nearest(sims, ctx, 2) == [3, 1]  # tie 0.9: the later one (nearer the test input) first
    assert nearest(sims, ctx, 3) == [3, 1, 4]
    assert apply("remove", ctx, [3, 1], [0] * 6, 3, random.Random(0)) == ([0, 2, 4], {})
    assert apply("keep", ctx, [3, 1], [0] * 6, 3, random.Random(0)) == ([1, 3], {})
    ids, wrong = apply("corrupt", ctx, [3, 1], [0, 1, 2, 0, 1, 2], 3, random.Random(0))
    assert ids == ctx and set(wrong) == {1, 3} and wrong[1] != 1 and wrong[3] != 0
    with pytest.raises(TooFewDemonstrations, match="--nearest-k 6: the context has only 5"):
        nearest(sims, ctx, 6)
    assert sample_learning_ratio(0.8, 0.6, 0.5) == pytest.approx(2 / 3)
    assert sample_learning_ratio(0.5, 0.4, 0.5) is None
    assert sample_learning_ratio(0.45, 0.5, 0.5) is None  # the context loses to 0 shots: no gain to split


def test_remove_nearest_removes_exactly_the_k_most_similar_per_item():
    train = ["zebra lion tiger", "zebra lion cow", "cat dog", "fish bird", "owl hen", "cow pig", "ant bee", "elk yak"]
    splits = _splits(train, [0, 1, 2, 0, 1, 2, 0, 1], ["zebra lion", "ant bee"], [0, 1])
    runner = _runner(splits, shots=(0, 8), nearest=("remove", "keep", "corrupt"), nearest_k=2)
    runner.run()
    main = next(r for r in runner.records if r["shots"] == 8 and not r["arm"])
    removed = next(r for r in runner.records if r["arm"] == "remove-nearest")
    kept = next(r for r in runner.records if r["arm"] == "keep-nearest")
    corrupt = next(r for r in runner.records if r["arm"] == "corrupt-nearest")
    # by hand: the two training texts sharing "zebra lion"; "ant bee" shares words with item 6 only
    assert set(kept["context_ids"][0]) == {0, 1} and 6 in kept["context_ids"][1]
    for ctx, near in zip(removed["context_ids"], kept["context_ids"]):
        assert ctx == [i for i in main["demo_ids"] if i not in near]  # order kept, exactly k removed
    assert corrupt["context_ids"] == [main["demo_ids"]] * 2
    corrupt_base = next(b for b in runner.baselines if b["arm"] == "corrupt-nearest")
    assert corrupt_base["in_context_majority"] is not None
    summary = runner.results({}, {}, 0.0)["summary"]["test"]
    assert "sample_learning_ratio" in summary["incremental+remove-nearest"]["8"]
    assert set(summary) == {"incremental", "incremental+remove-nearest", "incremental+keep-nearest",
                            "incremental+corrupt-nearest"}


def test_the_tiny_run_reports_the_order_diagnostic():
    """`evalm run configs/tiny.toml` scores each synthetic draw in two orders and label-sorted beside
    random; its summary.md states the order spread beside the draw spread and the paired difference."""
    from pathlib import Path

    from evalm.icl_eval.tasks.synthetic import SyntheticConfig, episode, synthetic_task
    from evalm.launcher.report import headline
    from evalm.launcher.run_file import load_run
    from evalm.launcher.summary import _icl_lines

    entry = next(e for e in load_run(Path(__file__).resolve().parents[2] / "configs" / "tiny.toml").evals
                 if "--order-seeds" in e.args)
    assert entry.task == "synthetic" and "label-sorted" in entry.args[entry.args.index("--order") + 1]
    cfg = SyntheticConfig(n_test=8)
    config = EvalConfig(methods=("incremental",), shots=(0, 8), seeds=(1, 2), order_seeds=(1, 2),
                        order=("random", "label-sorted"))
    runner = Runner(tiny_evalm("eva"), synthetic_task(cfg), config, MethodOptions(),
                    SeedSplits(lambda seed: episode(seed, cfg), False))
    runner.run()
    res = runner.results({}, {}, 0.0)
    block = {**res, "headline": {m: headline(res["summary"], m) for m in res["summary"]["test"]}}
    text = "\n".join(_icl_lines("synthetic-order", {"msit": block}))
    assert "incremental at 8: spread over 2 orders of the same demonstrations" in text
    assert "incremental+label-sorted at 8:" in text and "against the main order" in text


def test_nearest_by_a_local_encoder_removes_the_k_highest_cosines(tmp_path):
    """`nearest_embedding`: a tiny random BERT saved to a folder; the oracle embeds each text itself."""
    import torch
    import transformers

    words = ["zebra", "lion", "tiger", "cow", "cat", "dog", "fish", "bird", "owl", "hen", "pig", "ant"]
    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    transformers.BertTokenizer(str(tmp_path / "vocab.txt")).save_pretrained(tmp_path / "enc")
    torch.manual_seed(0)
    model = transformers.BertModel(transformers.BertConfig(vocab_size=17, hidden_size=16, num_hidden_layers=1,
                                                           num_attention_heads=2, intermediate_size=32)).eval()
    model.save_pretrained(tmp_path / "enc")
    train = ["zebra lion", "tiger cow", "cat dog", "fish bird", "owl hen", "cow pig", "ant zebra", "lion cat"]
    splits = _splits(train, [0, 1, 2, 0, 1, 2, 0, 1], ["hen pig"], [0])
    runner = _runner(splits, shots=(8,), seeds=(3,), nearest=("remove",), nearest_k=3,
                     nearest_embedding=str(tmp_path / "enc"))  # seed 3 puts item 3 first: TF-IDF ties pick another
    runner.run()
    tok = transformers.BertTokenizer.from_pretrained(tmp_path / "enc")

    def embed(text):
        with torch.no_grad():
            h = model(**tok([text], return_tensors="pt")).last_hidden_state[0].mean(0)  # one text: no padding
        return (h / h.norm()).double().numpy()

    cos = {i: float(embed(t) @ embed("hen pig")) for i, t in enumerate(train)}
    top3 = set(sorted(cos, key=lambda i: -cos[i])[:3])
    from evalm.icl_eval.protocol.selection import TopK

    assert 3 in top3 and TopK(train).similarities("hen pig")[3] == 0  # an item TF-IDF finds unrelated: they differ
    removed = next(r for r in runner.records if r["arm"] == "remove-nearest")["context_ids"][0]
    assert set(range(8)) - set(removed) == top3


def _cell_records(arm: str, shots: int, correct_per_seed: list[list[int]]) -> list[dict]:
    n = len(correct_per_seed[0])
    return [{"method": "m", "split": "test", "seed": s + 1, "shots": shots, "arm": arm, "order_seed": None,
             "item_set": 0, "item_ids": list(range(n)), "correct": c, "accuracy": sum(c) / n, "macro_f1": 0.0,
             "seconds_per_item": 0.0, "demos_used_mean": float(shots)} for s, c in enumerate(correct_per_seed)]


def test_the_sample_learning_ratio_needs_a_significant_gain_over_0_shots():
    """By hand: 0 shots gets 4 of 20 items right in every draw. A full context that gets 16 right
    (+0.6, interval above zero) with 10 right once the nearest are removed has SLR (0.8 - 0.5) / 0.6 = 0.5;
    a full context that gets 5 right (+0.05, one item: the interval reaches zero) has none, and says why."""
    from evalm.icl_eval.stats.summary import summarize

    def run(full_right: int, removed_right: int) -> dict:
        zero = [[1] * 4 + [0] * 16] * 3
        full = [[1] * full_right + [0] * (20 - full_right)] * 3
        removed = [[1] * removed_right + [0] * (20 - removed_right)] * 3
        records = (_cell_records("", 0, zero) + _cell_records("", 8, full)
                   + _cell_records("remove-nearest", 8, removed))
        baselines = [{"split": "test", "seed": r["seed"], "shots": r["shots"], "arm": r["arm"], "item_set": 0,
                      "item_ids": r["item_ids"], **{b: [0.5] * 20 for b in BASELINES}} for r in records]
        return summarize(records, baselines)["test"]["m+remove-nearest"]["8"]

    assert run(16, 10)["sample_learning_ratio"] == pytest.approx(0.5)
    weak = run(5, 4)
    assert weak["sample_learning_ratio"] is None  # the plain ratio would be (0.25 - 0.2) / 0.05 = 1.0
    assert "+0.050 [+0.000, " in weak["sample_learning_ratio_undefined"]


def test_runs_split_by_draw_and_order_seed_pool_to_the_single_runs_summary(tmp_path):
    """`evalm eval tables A+B+...` pools runs made one seed per process: pooled, runs of
    (draw 1, order 1), (draw 1, order 2) and (draw 2, orders 1-2) summarise exactly as one run of
    draws 1-2 x orders 1-2, the nearest arms and their baselines included (each split repeats its
    draw's baseline records once per run; counted twice they would pose as extra draws)."""
    from evalm.icl_eval.report import merged
    from evalm.icl_eval.protocol.units import changes, without_execution

    train = ["zebra lion tiger", "zebra lion cow", "cat dog", "fish bird", "owl hen", "cow pig", "ant bee", "elk yak"]
    splits = _splits(train, [0, 1, 2, 0, 1, 2, 0, 1], ["zebra lion", "ant bee", "cat owl"], [0, 1, 2])
    lm = tiny_evalm("full")

    def run(seeds, order_seeds) -> dict:
        runner = _runner(splits, lm=lm, seeds=seeds, order_seeds=order_seeds, shots=(0, 6),
                         nearest=("remove", "keep"), nearest_k=2)
        runner.run()
        return runner.results({}, {}, 0.0)

    whole = run((1, 2), (1, 2))
    paths = []
    for i, (seeds, orders) in enumerate((((1,), (1,)), ((1,), (2,)), ((2,), (1, 2)))):
        (tmp_path / str(i)).mkdir()
        paths.append(tmp_path / str(i) / "results.json")
        paths[-1].write_text(json.dumps(run(seeds, orders)))
    pooled = merged(paths)
    assert len(pooled["baseline_records"]) == len(whole["baseline_records"])
    diff = changes(without_execution(whole["summary"]), without_execution(pooled["summary"]))
    assert diff == [], "\n".join(diff)
