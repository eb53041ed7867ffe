"""Tasks: a template I(x, y), a label space with its verbalizer, and local data (ICL_SPEC §1).

Two built-in template sets: EVALM's Table 8 (`evalm`, the paper's ten tasks) and Structured
Prompting's Appendix A (`structured`). A user task comes from a small TOML or YAML file.
Data is read from local files only: `.jsonl`, `.json`, `.csv`, `.parquet`, or a folder written by
`datasets.save_to_disk` (read with pyarrow, so `datasets` is not needed). Nothing is downloaded.

A template is a string with `{field}` slots and one `{label}` slot. For multiple-choice tasks
(COPA) the candidates are item fields (`choice_fields`) and the label is the index of the correct
one; otherwise the candidates are the verbalizer words and the label is an index into them.
"""

from __future__ import annotations

import csv
import json
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class Task:
    """One classification or multiple-choice task."""

    name: str
    template: str
    """`{field}` slots for the input and exactly one `{label}` slot for the answer."""
    labels: tuple[str, ...] = ()
    """Verbalizer: label index -> words. Empty for multiple choice (see `choice_fields`)."""
    label_field: str = "label"
    """The item field holding the gold label."""
    label_values: tuple[Any, ...] = ()
    """Raw values of `label_field` in verbalizer order (default 0..n-1, or the verbalizer words)."""
    choice_fields: tuple[str, ...] = ()
    """Multiple choice: the item fields whose texts are the candidates (COPA's choice1, choice2)."""
    instruction: str = ""
    """Text placed once before the demonstrations (Structured Prompting's AGNews instruction)."""
    field_aliases: dict[str, str] = field(default_factory=dict)
    """Template field -> data column, when the data names a field differently."""
    source: str = ""
    """Where the template comes from (paper and table), recorded in results."""

    def __post_init__(self) -> None:
        slots = template_fields(self.template)
        if slots.count("label") != 1:
            raise ValueError(f"task {self.name!r}: the template needs exactly one {{label}} slot: {self.template!r}")
        if not self.labels and not self.choice_fields:
            raise ValueError(f"task {self.name!r}: give `labels` (a verbalizer) or `choice_fields` (multiple choice)")

    @property
    def input_fields(self) -> list[str]:
        return [f for f in template_fields(self.template) if f != "label"]

    def n_candidates(self) -> int:
        return len(self.choice_fields) if self.choice_fields else len(self.labels)

    def candidates(self, item: dict[str, Any]) -> list[str]:
        """The answer strings that fill `{label}` for this item, in label-index order."""
        if self.choice_fields:
            return [str(item[self._column(f)]) for f in self.choice_fields]
        return list(self.labels)

    def gold(self, item: dict[str, Any]) -> int:
        """The gold label index of an item; an unknown value is an error naming it."""
        raw = item[self._column(self.label_field)]
        values = self.label_values or (tuple(range(self.n_candidates())) if not isinstance(raw, str) else self.labels)
        for i, v in enumerate(values):
            if raw == v or str(raw) == str(v):
                return i
        raise ValueError(f"task {self.name!r}: label {raw!r} is not among {list(values)}")

    def fields(self, item: dict[str, Any]) -> dict[str, str]:
        """The template's input fields of an item, as strings."""
        out = {}
        for name in self.input_fields:
            column = self._column(name)
            if column not in item:
                raise KeyError(f"task {self.name!r}: item has no field {column!r} (has {sorted(item)})")
            out[name] = str(item[column]).strip()
        return out

    def _column(self, name: str) -> str:
        return self.field_aliases.get(name, name)


def template_fields(template: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


# The EVALM paper's Table 8 (Appendix C.2). Field names follow the GLUE/SuperGLUE column names;
# `field_aliases` maps them where the table's slot names differ. COPA's "Correct Answer: {Choices}"
# is scored as multiple choice over the two choices (the table's "false / true" is whether the shown
# choice is the correct one, i.e. the candidate with the highest score is predicted).
EVALM_TASKS: dict[str, Task] = {
    "sst2": Task("sst2", "{label} Movie Review: {sentence}", ("Negative", "Positive"), source="EVALM Table 8"),
    "sst5": Task("sst5", "{sentence} It is {label}", ("terrible", "bad", "okay", "good", "great"), source="EVALM Table 8"),
    "mnli": Task(
        "mnli", "{premise} ? {label} , {hypothesis}", ("Yes", "Maybe", "No"),
        source="EVALM Table 8 (label order follows MNLI: 0 entailment, 1 neutral, 2 contradiction)",
    ),
    "trec": Task(
        "trec", "{sentence} It is about {label}",
        ("abbreviation", "entity", "description and abstract concept", "human being", "location", "numeric value"),
        label_field="coarse_label", source="EVALM Table 8",
    ),
    "wic": Task(
        "wic",
        "{sentence1}\n{sentence2}\nquestion: Is the word {word} used in the same way in the two sentences above?\nanswer: {label}",
        ("no", "yes"), source="EVALM Table 8",
    ),
    "multirc": Task(
        "multirc", "Context: {paragraph}\n{question}\n{label} answer: {answer}", ("incorrect", "correct"),
        source="EVALM Table 8",
    ),
    "boolq": Task(
        "boolq", "Context: {passage}\nQuestion: {question} ?\nanswer: {label}", ("no", "yes"), source="EVALM Table 8",
    ),
    "agnews": Task(
        "agnews", "{text} It is about {label}", ("world", "sports", "business", "technology"), source="EVALM Table 8",
    ),
    "wsc": Task(
        "wsc",
        "{text}\nQuestion: In the passage above, what does the pronoun {span2_text} refer to?\nAnswer: {span1_text} "
        "This is a {label} answer.",
        ("false", "true"), source="EVALM Table 8",
    ),
    "copa": Task(
        "copa", "Context: {premise}\nCorrect Answer: {label}", choice_fields=("choice1", "choice2"),
        source="EVALM Table 8 (scored as multiple choice over choice1/choice2)",
    ),
}

# Structured Prompting, Appendix A (text classification), the second template set.
STRUCTURED_TASKS: dict[str, Task] = {
    "sst2": Task("sst2", "Sentence: {sentence} Label: {label}", ("Negative", "Positive"), source="Structured Prompting App. A"),
    "sst5": Task(
        "sst5", "Sentence: {sentence} Label: {label}", ("terrible", "bad", "neutral", "good", "great"),
        source="Structured Prompting App. A",
    ),
    "mr": Task("mr", "Review: {text} Sentiment: {label}", ("Negative", "Positive"), source="Structured Prompting App. A"),
    "subj": Task("subj", "Input: {text} Type: {label}", ("objective", "subjective"), source="Structured Prompting App. A"),
    "dbpedia": Task(
        "dbpedia", "Input: {content} Type: {label}",
        ("company", "school", "artist", "athlete", "politics", "transportation", "building", "nature", "village",
         "animal", "plant", "album", "film", "book"),
        source="Structured Prompting App. A",
    ),
    "agnews": Task(
        "agnews", "News: {text} Type: {label}", ("World", "Sports", "Business", "Technology"),
        instruction="Classify the news articles into the categories of World, Sports, Business, and Technology.",
        source="Structured Prompting App. A",
    ),
    "trec": Task(
        "trec", "Question: {text} Type: {label}",
        ("Expression", "Entity", "Description", "Person", "Location", "Number"),
        label_field="coarse_label", source="Structured Prompting App. A (order follows TREC's coarse labels)",
    ),
    "cb": Task(
        "cb", "{premise} Question: {hypothesis} True, False, or Neither? Answer: {label}", ("True", "False", "Neither"),
        source="Structured Prompting App. A",
    ),
    "boolq": Task("boolq", "Passage: {passage} Question: {question} Answer: {label}", ("No", "Yes"),
                  source="Structured Prompting App. A"),
    "rte": Task("rte", "Passage: {premise} Question: {hypothesis} Yes or No? {label}", ("Yes", "No"),
                source="Structured Prompting App. A"),
}

TEMPLATE_SETS: dict[str, dict[str, Task]] = {"evalm": EVALM_TASKS, "structured": STRUCTURED_TASKS}


def get_task(name: str, template_set: str = "evalm") -> Task:
    """A built-in task by name, or a user task from a `.toml`/`.yaml` file."""
    if Path(name).suffix in (".toml", ".yaml", ".yml"):
        return read_task_file(name)
    if template_set not in TEMPLATE_SETS:
        raise ValueError(f"template set {template_set!r} is not known; valid: {sorted(TEMPLATE_SETS)}")
    tasks = TEMPLATE_SETS[template_set]
    if name not in tasks:
        raise ValueError(f"task {name!r} has no {template_set!r} template; valid: {sorted(tasks)} or a .toml/.yaml file")
    return tasks[name]


def read_task_file(path: str | Path) -> Task:
    """A user task: a `[task]` table (TOML) or `task:` mapping (YAML) with Task's fields.

    Relative data paths in the file (`train`, `validation`, `test`) are kept in `data_files`
    by `task_data_files`; this function only builds the Task.
    """
    spec = _task_table(path)
    spec = {k: v for k, v in spec.items() if k not in SPLITS and k != "data"}
    for key in ("labels", "label_values", "choice_fields"):
        if key in spec:
            spec[key] = tuple(spec[key])
    spec.setdefault("name", Path(path).stem)
    spec.setdefault("source", str(path))
    valid = set(Task.__dataclass_fields__)
    unknown = sorted(set(spec) - valid)
    if unknown:
        raise ValueError(f"{path}: unknown task key(s) {unknown}; valid: {sorted(valid | set(SPLITS) | {'data'})}")
    return Task(**spec)


def task_data_files(path: str | Path) -> dict[str, Path]:
    """The split files or data folder named in a task file, resolved against the file's folder."""
    spec, base = _task_table(path), Path(path).parent
    out = {s: base / spec[s] for s in SPLITS if s in spec}
    if "data" in spec:
        out.update(find_splits(base / spec["data"]))
    return out


def _task_table(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".toml":
        import tomllib

        data = tomllib.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    if not isinstance(data, dict) or not isinstance(data.get("task"), dict):
        raise ValueError(f"{path}: expected a [task] table (TOML) or a `task:` mapping (YAML)")
    return dict(data["task"])


# ----------------------------------------------------------------------------------------------
# Data: local files only.

def find_splits(folder: str | Path) -> dict[str, Path]:
    """Split name -> file or folder inside a data folder (`train.jsonl`, `test.csv`, `train/` ...)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: data folder not found")
    found: dict[str, Path] = {}
    for split in SPLITS:
        aliases = (split, "dev") if split == "validation" else (split,)
        for alias in aliases:
            for suffix in (".jsonl", ".json", ".csv", ".parquet", ""):
                candidate = folder / f"{alias}{suffix}"
                if candidate.exists() and split not in found:
                    found[split] = candidate
    if not found:
        raise FileNotFoundError(f"{folder}: no train/validation/test .jsonl/.csv/.parquet files or dataset folders")
    return found


def read_items(path: str | Path) -> list[dict[str, Any]]:
    """Rows of one split as dicts, from jsonl/json/csv/parquet or a `save_to_disk` folder."""
    path = Path(path)
    if path.is_dir():
        return _read_saved_dataset(path)
    suffix = path.suffix
    if suffix == ".jsonl":
        with path.open(encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, list) else data["data"]
    if suffix == ".csv":
        with path.open(encoding="utf-8", newline="") as f:
            return [_numeric(row) for row in csv.DictReader(f)]
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    raise ValueError(f"{path}: unsupported data file (use .jsonl, .json, .csv, .parquet or a datasets folder)")


def _read_saved_dataset(folder: Path) -> list[dict[str, Any]]:
    """A `datasets.Dataset.save_to_disk` folder: Arrow IPC stream files listed in state.json."""
    import pyarrow as pa

    state = folder / "state.json"
    if not state.is_file():
        raise ValueError(f"{folder}: not a saved `datasets` split (no state.json); for a DatasetDict pass its folder")
    files = [folder / f["filename"] for f in json.loads(state.read_text())["_data_files"]]
    rows: list[dict[str, Any]] = []
    for file in files:
        with pa.memory_map(str(file)) as source:
            rows.extend(pa.ipc.open_stream(source).read_all().to_pylist())
    return rows


def _numeric(row: dict[str, str]) -> dict[str, Any]:
    """CSV cells are strings; integer-looking labels become ints so they match 0..n-1."""
    return {k: int(v) if isinstance(v, str) and v.lstrip("-").isdigit() else v for k, v in row.items()}


def load_splits(files: dict[str, Path]) -> dict[str, list[dict[str, Any]]]:
    return {split: read_items(path) for split, path in files.items()}
