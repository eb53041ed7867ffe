"""Demonstration selection, prompt layout, task files and data loaders.

Run: python -m pytest tests/icl_eval/test_selection_prompts.py -q
"""

from __future__ import annotations

import json

import pytest

from evalm.text.tokenizer import ByteTokenizer
from evalm.icl_eval.tasks.prompts import PromptBuilder
from evalm.icl_eval.protocol.selection import NotEnoughItems, TopK, dataset_level
from evalm.icl_eval.tasks.data import read_split, task_data_files
from evalm.icl_eval.tasks.task import EVALM_TASKS, get_task


def test_dataset_level_is_seeded_ordered_and_excludes():
    a = dataset_level(50, 10, seed=7, exclude=[3, 4, 5])
    assert a == dataset_level(50, 10, seed=7, exclude=[3, 4, 5])  # deterministic, order included
    assert a != sorted(a)  # an ordered draw, not a sorted set
    assert not {3, 4, 5} & set(a) and len(set(a)) == 10
    assert dataset_level(50, 10, seed=8, exclude=[3]) != a


def test_too_few_training_items_says_how_many():
    with pytest.raises(NotEnoughItems, match="only 7 training items"):
        dataset_level(10, 8, seed=0, exclude=[0, 1, 2])


def test_balanced_draw_alternates_labels():
    labels = [i % 3 for i in range(30)]
    ids = dataset_level(30, 6, seed=1, labels=labels)
    assert sorted(labels[i] for i in ids) == [0, 0, 1, 1, 2, 2]


def test_topk_most_similar_last_and_never_the_item_itself():
    texts = ["the cat sat", "a dog ran", "the cat sat on the mat", "stocks fell", "cat cat cat"]
    topk = TopK(texts)
    ids = topk.select("the cat sat on the mat", 3, exclude=[2])
    assert 2 not in ids and ids[-1] == 0  # "the cat sat" is the nearest -> next to the test input
    with pytest.raises(NotEnoughItems):
        topk.select("x", 5, exclude=[2])


def test_context_keeps_demo_order_and_answer_spans():
    task = EVALM_TASKS["sst2"]  # label first: "{label} Movie Review: {sentence}"
    pb = PromptBuilder(task, ByteTokenizer())
    rows = [{"sentence": f"film {i}", "label": i % 2} for i in range(3)]
    demos = [pb.demo(i, r) for i, r in enumerate(rows)]
    text = ByteTokenizer().decode(pb.context(demos[::-1]))
    assert text == "Negative Movie Review: film 2\nPositive Movie Review: film 1\nNegative Movie Review: film 0"
    item = pb.test_item(9, {"sentence": "great", "label": 1}, n_shots=3)
    for cand, word in zip(item.candidates, task.labels):
        assert bytes(cand.tokens[cand.answer_start : cand.answer_end]).decode() == word
        assert cand.tokens[: cand.body_start] == pb.sep
    assert item.gold == 1


def test_user_task_file_and_loaders(tmp_path):
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps({"review": f"r{i}", "y": "pos" if i % 2 else "neg"}) for i in range(4)))
    (tmp_path / "test.csv").write_text("review,y\ngood,pos\nbad,neg\n")
    (tmp_path / "task.toml").write_text(
        '[task]\nname = "mine"\ntemplate = "Review: {review} Sentiment: {label}"\nlabels = ["negative", "positive"]\n'
        'label_field = "y"\nlabel_values = ["neg", "pos"]\ntrain = "train.jsonl"\ntest = "test.csv"\n'
    )
    task = get_task(str(tmp_path / "task.toml"))
    files = task_data_files(tmp_path / "task.toml")
    test = read_split(files["test"])
    assert [task.gold(r) for r in test] == [1, 0]
    assert [task.gold(r) for r in read_split(files["train"])] == [0, 1, 0, 1]
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(test), tmp_path / "v.parquet")
    assert read_split(tmp_path / "v.parquet") == test
    with pytest.raises(ValueError, match="unknown task key"):
        (tmp_path / "bad.toml").write_text('[task]\ntemplate = "{x} {label}"\nlabels = ["a"]\nlabelz = 1\n')
        get_task(str(tmp_path / "bad.toml"))


def test_builtin_template_sets_cover_the_papers():
    assert set(EVALM_TASKS) == {"sst2", "sst5", "mnli", "trec", "wic", "multirc", "boolq", "agnews", "wsc", "copa"}
    assert get_task("agnews", "structured").instruction
    with pytest.raises(ValueError, match="valid"):
        get_task("nope")


def test_label_token_counts_reveal_unequal_verbalizers():
    from evalm.icl_eval.tasks.task import Task

    uneven = PromptBuilder(Task("t", "Q: {q} A: {label}", ("no", "yes")), ByteTokenizer())
    assert uneven.label_token_counts() == {"no": 3, "yes": 4}  # " no", " yes" in bytes
    even = PromptBuilder(Task("t", "{x} {label}", ("A", "B")), ByteTokenizer())
    assert even.label_token_counts() == {"A": 2, "B": 2}
