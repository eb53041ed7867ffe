"""The task folder written by icl_eval.tasks.folder reads back through icl_eval's own readers.

Run: python -m pytest tests/icl_eval/test_task_folder.py -q
"""

from __future__ import annotations

import pytest

from evalm.icl_eval.tasks.data import task_data_files, task_splits
from evalm.icl_eval.tasks.folder import write_task_folder
from evalm.icl_eval.tasks.task import EVALM_TASKS, Task, read_task_file


def test_a_written_task_folder_reads_back_as_the_same_task_and_rows(tmp_path):
    task = Task("pairs", "Q: {question} \u2014 {context} A: {label}", ("nein", "ja"), label_values=(0, 1),
                instruction="Answer \"ja\" or \"nein\".", field_aliases={"context": "passage"}, source="test")
    rows = {"train": [{"question": f"q{i}", "passage": f"p\u00e9 {i}", "label": i % 2} for i in range(5)],
            "test": [{"question": "last", "passage": "x", "label": 1}]}
    task_file, files = write_task_folder(tmp_path / "pairs", task, rows, comment=["written by a test"])
    assert task_file.read_text().startswith("# written by a test\n[task]\n")
    assert read_task_file(task_file) == task
    assert task_data_files(task_file) == files == {s: tmp_path / "pairs" / f"{s}.jsonl" for s in rows}
    splits, _ = task_splits(task, str(task_file), None)
    assert {s: list(r) for s, r in splits.items()} == rows
    assert [task.gold(it) for it in splits["train"]] == [0, 1, 0, 1, 0]


def test_a_hub_task_or_an_unknown_split_is_refused(tmp_path):
    with pytest.raises(ValueError, match="hub dataset"):
        write_task_folder(tmp_path / "sst2", EVALM_TASKS["sst2"], {"train": []})
    with pytest.raises(ValueError, match="unknown split"):
        write_task_folder(tmp_path / "x", Task("x", "{text} {label}", ("a", "b")), {"dev": []})
