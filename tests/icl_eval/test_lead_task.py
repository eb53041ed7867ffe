"""`write_lead_task`: a task folder's copy with every text cut to its lead, read back as a task.

    pytest tests/icl_eval/test_lead_task.py
"""

from __future__ import annotations

import json

import pytest

from evalm.config_toolkit import MissingInput
from evalm.icl_eval.tasks.data import load_splits, task_data_files
from evalm.icl_eval.tasks.folder import write_lead_task
from evalm.icl_eval.tasks.task import read_task_file


def test_the_lead_task_reads_back_with_each_text_cut_to_its_first_words(tmp_path):
    folder = tmp_path / "tasks" / "news"
    folder.mkdir(parents=True)
    rows = [{"text": " ".join(f"wörd{i}-{j}" for j in range(3 + 2 * i)), "label": i % 2} for i in range(6)]
    for split, part in (("train", rows[:4]), ("test", rows[4:])):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    (folder / "task.toml").write_text('[task]\nname = "news"\ntemplate = "{text} {label}"\nlabels = ["a", "b"]\n'
                                      'train = "train.jsonl"\ntest = "test.jsonl"\n')
    path = write_lead_task(folder / "task.toml", 4)
    assert path == tmp_path / "tasks" / "news-lead4" / "task.toml"
    task, splits = read_task_file(path), load_splits(task_data_files(path))
    assert task.name == "news-lead4" and task.labels == ("a", "b")
    got = [*splits["train"], *splits["test"]]
    assert [r["label"] for r in got] == [r["label"] for r in rows]
    assert [r["text"] for r in got] == [" ".join(r["text"].split(" ")[:4]) for r in rows]
    assert sum(len(r["text"].split()) > 4 for r in rows) == 5  # the cut did cut
    assert "wörd0-0" in (path.parent / "train.jsonl").read_text(encoding="utf-8")  # written as UTF-8, not escaped


def test_a_missing_task_file_is_one_line(tmp_path):
    with pytest.raises(MissingInput, match="task.toml not found"):
        write_lead_task(tmp_path / "tasks" / "news" / "task.toml", 4)
