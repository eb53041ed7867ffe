"""HELMET / Bertsch et al.'s five ICL tasks read from hub-layout caches built with `datasets` (no network),
and the new protocol flags through `evalm eval icl`: --help, results.json, one-line errors.

HF_HOME is a temporary folder (conftest). Run: python -m pytest tests/icl_eval/test_helmet_tasks.py -q
"""

from __future__ import annotations

import json

import datasets
import pytest

from evalm.text.data_source import DataSourceError
from evalm.icl_eval.tasks.data import task_splits, with_data_labels
from evalm.icl_eval.tasks.task import get_task
from tests.hub_cache import write_hub_cache
from tests.icl_eval.test_task_data import _tiny_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


def _labelled(column: str, names: list[str], extra: dict | None = None) -> datasets.Features:
    return datasets.Features({"text": datasets.Value("string"), column: datasets.ClassLabel(names=names),
                              **(extra or {})})


TREC_FEATURES = datasets.Features({"text": datasets.Value("string"),
                                   "coarse_label": datasets.ClassLabel(names=["ABBR", "ENTY", "DESC", "HUM", "LOC", "NUM"]),
                                   "fine_label": datasets.ClassLabel(names=["abb", "exp", "animal", "body"])})
TREC = {"train": {"text": ["What is NASA ?", "Where is Rome ?"], "coarse_label": [0, 4], "fine_label": [0, 2]},
        "test": {"text": ["Who wrote Hamlet ?"], "coarse_label": [3], "fine_label": [3]}}

# task -> (repo, config, splits with the dataset's real columns, features, the test row rendered with its gold name)
FIVE = {
    "banking77": ("PolyAI/banking77", None,
                  {"train": {"text": ["card lost", "pin locked"], "label": [0, 1]},
                   "test": {"text": ["where is my card"], "label": [0]}},
                  _labelled("label", ["card_arrival", "pin_blocked"]), "where is my card\nlabel: card_arrival"),
    "clinc150": ("clinc_oos", "plus",
                 {"train": {"text": ["book a flight", "play music"], "intent": [0, 1]},
                  "validation": {"text": ["put on a song"], "intent": [1]},
                  "test": {"text": ["unused"], "intent": [0]}},
                 _labelled("intent", ["book_flight", "play_music"]), "put on a song\nlabel: play_music"),
    "trec_coarse": ("CogComp/trec", None, TREC, TREC_FEATURES, "Who wrote Hamlet ?\nlabel: HUM"),
    "trec_fine": ("CogComp/trec", None, TREC, TREC_FEATURES, "Who wrote Hamlet ?\nlabel: body"),
}


@pytest.mark.parametrize("name", sorted(FIVE))
def test_each_helmet_task_reads_its_dataset_split_and_label_names(name, tmp_path):
    repo, config, splits, features, expected = FIVE[name]
    write_hub_cache(tmp_path, repo, config, splits, features=features)
    task = get_task(name)  # found beside EVALM's ten without --eval.template_set
    rows, info = task_splits(task, name, None)
    task = with_data_labels(task, rows, info)
    row = rows["test"][0]
    assert task.template.format(label=task.candidates(row)[task.gold(row)], **task.fields(row)) == expected
    assert len(rows["test"]) == 1


def test_nlu_cuts_its_one_split_ninety_ten_with_helmets_seed(tmp_path):
    texts = [f"utterance {i}" for i in range(40)]
    labels = [i % 4 for i in range(40)]
    features = _labelled("label", ["alarm_set", "alarm_query", "play_music", "weather_query"])
    write_hub_cache(tmp_path, "xingkunliuxtracta/nlu_evaluation_data", None, {"train": {"text": texts, "label": labels}},
                    features=features)
    rows, info = task_splits(get_task("nlu"), "nlu", None)
    assert (len(rows["train"]), len(rows["test"])) == (36, 4) and "10%" in info["note"]
    test_texts = {r["text"] for r in rows["test"]}
    assert not test_texts & {r["text"] for r in rows["train"]}
    oracle = datasets.Dataset.from_dict({"text": texts, "label": labels}).train_test_split(test_size=0.1, seed=42)
    assert test_texts == set(oracle["test"]["text"])  # HELMET: data.train_test_split(test_size=0.1, seed=42)
    task = with_data_labels(get_task("nlu"), rows, info)
    assert task.labels == ("alarm_set", "alarm_query", "play_music", "weather_query")


def test_label_names_missing_from_the_data_is_one_clear_error(tmp_path):
    write_hub_cache(tmp_path, "PolyAI/banking77", None, {"train": {"text": ["a"], "label": [0]},
                                                         "test": {"text": ["b"], "label": [0]}})  # plain ints
    rows, info = task_splits(get_task("banking77"), "banking77", None)
    with pytest.raises(DataSourceError, match=r"column 'label' carries no label names .* a task file with `labels`"):
        with_data_labels(get_task("banking77"), rows, info)


# ---------------------------------------------------------------------------------------------
# the flags through `evalm eval icl`

NEW_FLAGS = ("--budgets", "--label-map", "--order", "--order-seeds", "--nearest", "--nearest-k")


def test_help_explains_every_new_option_with_its_default(capsys):
    from evalm.icl_eval.cli_args import icl_parser

    text = " ".join(icl_parser().format_help().split())
    for flag in NEW_FLAGS:
        start = text.index(flag + " ")
        assert "(default:" in text[start: text.index(")", text.index("(default:", start)) + 1]
    assert "(default: none)" in text and "(default: random)" in text and "(default: 1)" in text


def _task_folder(tmp_path, choice: bool = False):
    rows = [{"text": f"review number {i}", "label": i % 2, "c1": "yes", "c2": "no"} for i in range(12)]
    folder = tmp_path / "task"
    folder.mkdir()
    for split, part in (("train", rows[:10]), ("test", rows[10:])):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    body = 'choice_fields = ["c1", "c2"]' if choice else 'labels = ["bad", "top"]'
    (folder / "task.toml").write_text(f'[task]\nname = "toy"\ntemplate = "{{text}}: {{label}}"\n{body}\n'
                                      'train = "train.jsonl"\ntest = "test.jsonl"\n')
    return folder / "task.toml"


def test_the_new_options_reach_results_json(tmp_path):
    from evalm.icl_eval.cli import main

    ckpt = _tiny_checkpoint(tmp_path / "ckpt")
    out = tmp_path / "out"
    assert main(["icl", "--checkpoint", str(ckpt), "--task", str(_task_folder(tmp_path)), "--methods", "incremental",
                 "--budgets", "0,60", "--seeds", "1,2", "--label-map", "symbols", "--order", "random,label-sorted",
                 "--order-seeds", "3,4", "--nearest", "remove", "--nearest-k", "1", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    ev = res["protocol"]["eval"]
    assert (ev["budgets"], ev["label_map"], ev["order"], ev["order_seeds"], ev["nearest"], ev["nearest_k"]) == \
        ([0, 60], "symbols", ["random", "label-sorted"], [3, 4], ["remove"], 1)
    assert set(res["protocol"]["label_maps"]) == {"1", "2"} and res["summary"]["axis"] == "budget"
    cell = res["summary"]["test"]["incremental"]["60"]
    assert {"order_split", "shots_per_seed", "prompt_tokens_per_seed", "vs_0_shots", "baselines"} <= set(cell)
    assert all(t <= 60 for t in cell["prompt_tokens_per_seed"])
    assert set(res["summary"]["test"]) == {"incremental", "incremental+label-sorted", "incremental+remove-nearest"}


@pytest.mark.parametrize("args, message", [
    (["--budgets", "0,5"], "--budgets 5: below one demonstration"),
    (["--budgets", "0,60", "--nearest", "keep", "--nearest-k", "9"], "--nearest-k 9: --budgets 60 (seed 1) gives"),
    (["--budgets", "0,60", "--shots", "0,1"], "--budgets and --shots: the grid is by token budget or by shot count"),
    (["--shots", "0,2", "--nearest", "remove", "--nearest-k", "3"], "--nearest-k 3: more than the 2 demonstrations"),
    (["--shots", "0,2", "--label-map", "int", "--choice"], "--label-map int: task 'toy' is multiple choice"),
])
def test_bad_input_is_one_clear_line(tmp_path, capsys, args, message):
    from evalm.icl_eval.cli import main

    choice = "--choice" in args
    args = [a for a in args if a != "--choice"]
    ckpt = _tiny_checkpoint(tmp_path / "ckpt")
    assert main(["icl", "--checkpoint", str(ckpt), "--task", str(_task_folder(tmp_path, choice)), "--methods",
                 "incremental", "--seeds", "1", *args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1
