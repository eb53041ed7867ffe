"""Task data through `datasets`, offline: saved folders, parquet, a hub-layout cache, the ten tasks.

Every dataset here is built with `datasets` itself; HF_HOME is a temporary folder (conftest).
Run: python -m pytest tests/icl_eval/test_task_data.py -q
"""

from __future__ import annotations

import json

import datasets
import pytest
import torch

from evalm import EvalmModel, ModelConfig
from evalm.text.data_source import DataSourceError, cache_dir
from evalm.io import save_model
from evalm.icl_eval.tasks.data import Rows, task_splits
from evalm.icl_eval.tasks.task import EVALM_TASKS, get_task
from tests.hub_cache import write_hub_cache

HIDDEN = -1  # GLUE / SuperGLUE publish their test splits without labels

# Per task: (the dataset id and config the table names, its splits with the dataset's real columns,
# the one labelled row the test split must be, and that row rendered by Table 8 with its gold label).
TEN_TASKS = {
    "sst2": ("nyu-mll/glue", "sst2", {
        "train": {"sentence": ["a dull film ", "a fine film"], "label": [0, 1], "idx": [0, 1]},
        "validation": {"sentence": ["a gripping film"], "label": [1], "idx": [0]},
        "test": {"sentence": ["unlabelled"], "label": [HIDDEN], "idx": [0]}},
     "Positive Movie Review: a gripping film"),
    "sst5": ("SetFit/sst5", None, {
        "train": {"text": ["awful", "great"], "label": [0, 4], "label_text": ["very negative", "very positive"]},
        "validation": {"text": ["meh"], "label": [1], "label_text": ["negative"]},
        "test": {"text": ["it was fine"], "label": [2], "label_text": ["neutral"]}},
     "it was fine It is okay"),
    "mnli": ("nyu-mll/glue", "mnli", {
        "train": {"premise": ["p1", "p2"], "hypothesis": ["h1", "h2"], "label": [1, 2], "idx": [0, 1]},
        "validation_matched": {"premise": ["A man sleeps"], "hypothesis": ["A person rests"], "label": [0], "idx": [0]},
        "validation_mismatched": {"premise": ["x"], "hypothesis": ["y"], "label": [2], "idx": [0]},
        "test_matched": {"premise": ["u"], "hypothesis": ["v"], "label": [HIDDEN], "idx": [0]}},
     "A man sleeps ? Yes , A person rests"),
    "trec": ("CogComp/trec", None, {
        "train": {"text": ["What is NASA ?", "Where is Rome ?"], "coarse_label": [0, 4], "fine_label": [1, 32]},
        "test": {"text": ["Who wrote Hamlet ?"], "coarse_label": [3], "fine_label": [29]}},
     "Who wrote Hamlet ? It is about human being"),
    "wic": ("aps/super_glue", "wic", {
        "train": (_wic := {"word": ["run"], "sentence1": ["I run."], "sentence2": ["A run."], "start1": [2],
                          "start2": [2], "end1": [5], "end2": [5], "idx": [0], "label": [1]}),
        "validation": {**_wic, "word": ["bank"], "sentence1": ["He sat on the bank."],
                       "sentence2": ["The bank lent money."], "label": [0]},
        "test": {**_wic, "label": [HIDDEN]}},
     "He sat on the bank.\nThe bank lent money.\nquestion: Is the word bank used in the same way in the two "
     "sentences above?\nanswer: no"),
    "multirc": ("aps/super_glue", "multirc", {
        "train": (_mrc := {"paragraph": ["Sky."], "question": ["Color?"], "answer": ["red"],
                          "idx": [{"paragraph": 0, "question": 0, "answer": 0}], "label": [0]}),
        "validation": {**_mrc, "paragraph": ["Cats purr."], "question": ["What do cats do?"], "answer": ["purr"],
                       "label": [1]},
        "test": {**_mrc, "label": [HIDDEN]}},
     "Context: Cats purr.\nWhat do cats do?\ncorrect answer: purr"),
    "boolq": ("aps/super_glue", "boolq", {
        "train": {"question": ["is it"], "passage": ["It is."], "idx": [0], "label": [1]},
        "validation": {"question": ["is water wet"], "passage": ["Water is wet."], "idx": [0], "label": [1]},
        "test": {"question": ["q"], "passage": ["p"], "idx": [0], "label": [HIDDEN]}},
     "Context: Water is wet.\nQuestion: is water wet ?\nanswer: yes"),
    "agnews": ("fancyzhx/ag_news", None, {
        "train": {"text": ["Stocks fall", "Election held"], "label": [2, 0]},
        "test": {"text": ["Team wins cup"], "label": [1]}},
     "Team wins cup It is about sports"),
    "wsc": ("aps/super_glue", "wsc.fixed", {
        "train": (_wsc := {"text": ["Ann met Bo; she waved."], "span1_index": [0], "span2_index": [4],
                          "span1_text": ["Ann"], "span2_text": ["she"], "idx": [0], "label": [1]}),
        "validation": {**_wsc, "text": ["Mark told Pete he was late."], "span1_text": ["Mark"],
                       "span2_text": ["he"], "label": [1]},
        "test": {**_wsc, "label": [HIDDEN]}},
     "Mark told Pete he was late.\nQuestion: In the passage above, what does the pronoun he refer to?\n"
     "Answer: Mark This is a true answer."),
    "copa": ("aps/super_glue", "copa", {
        "train": (_copa := {"premise": ["It rained."], "choice1": ["We got wet."], "choice2": ["We got dry."],
                           "question": ["effect"], "idx": [0], "label": [0]}),
        "validation": {**_copa, "premise": ["The man broke his toe."], "choice1": ["He wore socks."],
                       "choice2": ["He dropped a hammer on his foot."], "question": ["cause"], "label": [1]},
        "test": {**_copa, "label": [HIDDEN]}},
     "Context: The man broke his toe.\nCorrect Answer: He dropped a hammer on his foot."),
}


def render(task, row) -> str:
    """Table 8's template filled with the row's fields and its gold answer."""
    return task.template.format(label=task.candidates(row)[task.gold(row)], **task.fields(row))


@pytest.mark.parametrize("name", sorted(TEN_TASKS))
def test_each_builtin_task_reads_its_dataset_from_the_offline_cache(name, tmp_path):
    repo, config, splits, expected = TEN_TASKS[name]
    write_hub_cache(tmp_path, repo, config, splits)
    task = get_task(name)
    rows, info = task_splits(task, name, None)
    assert len(rows["test"]) == 1 and render(task, rows["test"][0]) == expected
    assert len(rows["train"]) == len(next(iter(splits["train"].values())))
    assert [task.gold(r) for r in rows["train"]]  # every training label decodes
    hidden = any(k.startswith("test") and HIDDEN in v.get("label", []) for k, v in splits.items())
    assert (info["splits"]["test"] != "test") == hidden  # validation scored as test exactly where labels hide
    assert info["source"].startswith(repo) and (("hidden" in info["note"]) == hidden)


def test_the_table_names_every_paper_task_once():
    assert sorted(EVALM_TASKS) == sorted(TEN_TASKS)
    assert all(t.dataset and t.dataset.ids[0] == TEN_TASKS[n][0] for n, t in EVALM_TASKS.items())


def test_legacy_dataset_name_in_the_cache_is_found(tmp_path):
    """A cache written under the pre-2024 canonical name (`glue`, no namespace) serves `--task sst2`."""
    write_hub_cache(tmp_path, "glue", "sst2", TEN_TASKS["sst2"][2])
    rows, info = task_splits(get_task("sst2"), "sst2", None)
    assert info["source"] == "glue/sst2" and render(get_task("sst2"), rows["test"][0]).startswith("Positive")


def test_data_as_id_save_to_disk_and_parquet_folders(tmp_path):
    task = get_task("sst2")
    parts = {"train": {"sentence": ["s0", "s1", "s2"], "label": [0, 1, 0]},
             "test": {"sentence": ["t0", "t1"], "label": [1, 0]}}
    dd = datasets.DatasetDict({k: datasets.Dataset.from_dict(v) for k, v in parts.items()})
    dd.save_to_disk(str(tmp_path / "dict"))
    (tmp_path / "per_split").mkdir()
    (tmp_path / "pq").mkdir()
    for split, d in dd.items():
        d.save_to_disk(str(tmp_path / "per_split" / split))
        d.to_parquet(str(tmp_path / "pq" / f"{split}.parquet"))
    write_hub_cache(tmp_path, "SetFit/sst2", None, parts)
    for data in ("dict", "per_split", "pq"):
        rows, _ = task_splits(task, "sst2", str(tmp_path / data))
        assert [r["sentence"] for r in rows["test"]] == ["t0", "t1"] and list(rows["train"]) == dd["train"].to_list()
    rows, info = task_splits(task, "sst2", "SetFit/sst2")  # not the task's own dataset: splits by name
    assert info["splits"] == {"train": "train", "test": "test"} and [task.gold(r) for r in rows["test"]] == [1, 0]


def test_json_files_as_a_list_of_rows_or_under_data(tmp_path):
    rows = [{"sentence": "a", "label": 1}, {"sentence": "b", "label": 0}]
    (tmp_path / "train.json").write_text(json.dumps(rows))
    (tmp_path / "test.json").write_text(json.dumps({"data": rows[:1]}))
    splits, _ = task_splits(get_task("sst2"), "sst2", str(tmp_path))
    assert list(splits["train"]) == rows and list(splits["test"]) == rows[:1]


def test_rows_behave_like_a_list():
    rows = Rows(datasets.Dataset.from_dict({"x": list(range(5))}))
    assert len(rows) == 5 and rows[-1] == {"x": 4} and [r["x"] for r in rows[1:3]] == [1, 2]
    with pytest.raises(IndexError):
        rows[5]


def test_missing_dataset_is_one_message_with_the_fetch_command(tmp_path):
    with pytest.raises(DataSourceError) as err:
        task_splits(get_task("boolq"), "boolq", None)
    msg = str(err.value)
    assert "'aps/super_glue/boolq'" in msg and "load_dataset('aps/super_glue', 'boolq')" in msg
    assert str(cache_dir()) in msg and "HF_HOME=" in msg and "\n" not in msg
    with pytest.raises(DataSourceError, match=r"load_dataset\('CogComp/trec', revision='refs/convert/parquet'\)"):
        task_splits(get_task("trec"), "trec", None)  # its main branch is a loading script
    write_hub_cache(tmp_path, "nyu-mll/glue", "sst2", TEN_TASKS["sst2"][2])
    with pytest.raises(DataSourceError, match=r"config 'mnli'.*Available configs in the cache: \['sst2'\]"):
        task_splits(get_task("mnli"), "mnli", None)


def _tiny_checkpoint(folder):
    torch.manual_seed(0)
    model = EvalmModel(ModelConfig(vocab_size=257, d_model=16, n_layer=1, n_head=2, d_ff=32, window_size=8,
                                   chunk_size=4, circular_period=512, dropout=0.0, attn_dropout=0.0))
    model.init_weights()
    return save_model(model, folder)


def test_cli_icl_task_from_the_cache_states_the_split_protocol(tmp_path, capsys):
    from evalm.icl_eval.cli import main

    write_hub_cache(tmp_path, "nyu-mll/glue", "sst2", TEN_TASKS["sst2"][2] | {
        "validation": {"sentence": ["good", "bad", "fine"], "label": [1, 0, 1], "idx": [0, 1, 2]}})
    ckpt = _tiny_checkpoint(tmp_path / "ckpt")
    out = tmp_path / "out"
    assert main(["icl", "--checkpoint", str(ckpt), "--task", "sst2", "--methods", "incremental", "--shots", "0,1",
                 "--seeds", "1", "--out", str(out), "--save-predictions"]) == 0
    data = json.loads((out / "results.json").read_text())["protocol"]["data"]
    assert data["source"] == "nyu-mll/glue/sst2" and data["splits"]["test"] == "validation" and "hidden" in data["note"]
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert sorted({(p["item"], p["gold"]) for p in preds}) == [(0, 1), (1, 0), (2, 1)]  # validation, not test
    capsys.readouterr()
    assert main(["icl", "--checkpoint", str(ckpt), "--task", "boolq", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "load_dataset('aps/super_glue', 'boolq')" in err and "Traceback" not in err and err.count("\n") == 1
