"""Tasks: a template I(x, y), a label space with its verbalizer, and where its data lives (docs/evaluation.md).

Two built-in template sets: EVALM's Table 8 (`evalm`, the paper's ten tasks, each with the
Hugging Face dataset it is usually read from) and Structured Prompting's Appendix A
(`structured`). A user task comes from a small TOML or YAML file. Reading the data is
`icl_eval.tasks.data`'s job (through `datasets`, offline).

A template is a string with `{field}` slots and one `{label}` slot. For multiple-choice tasks
(COPA) the candidates are item fields (`choice_fields`) and the label is the index of the correct
one; otherwise the candidates are the verbalizer words and the label is an index into them.
"""

from __future__ import annotations

import functools
import string
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evalm.config_toolkit import ConfigError, InputError, parse_toml
from evalm.config_toolkit.files import MAX_CONFIG_BYTES, read_bounded
from evalm.icl_eval.tasks.task_yaml import read_yaml

SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class HubData:
    """Where a built-in task's data usually lives: a dataset id in the `datasets` cache (read offline)."""

    ids: tuple[str, ...]
    """Dataset ids to look for, preferred first (the hub's current name, then its legacy alias)."""
    config: str | None
    """The dataset config (GLUE/SuperGLUE subset), None for a dataset with one config."""
    splits: dict[str, str]
    """Protocol split -> dataset split. `test` is the labelled `validation` split where the hub's
    test labels are hidden (docs/evaluation.md, EVALM §4.1); `validation` then comes from train."""
    note: str = ""
    """What the split mapping means for the reported numbers; copied into results.json."""
    test_fraction: float | None = None
    """Datasets with one split: the test split is this fraction of it, cut by `train_test_split`
    with `split_seed` (HELMET's NLU protocol); None: the dataset's own splits."""
    split_seed: int = 42
    """Seed of that cut (HELMET's default seed)."""


_HIDDEN_TEST = ("the dataset's test labels are hidden: its labelled validation split is scored as the test split, "
                "and shot choice (choose_shot_on_validation) holds out items from train (EVALM §4.1)")
_LABELLED_TEST = "the dataset's labelled test split is the test split; shot choice holds out items from train"


def _glue(config: str, test: str = "validation") -> HubData:
    return HubData(("nyu-mll/glue", "glue"), config, {"train": "train", "test": test}, _HIDDEN_TEST)


def _super_glue(config: str) -> HubData:
    return HubData(("aps/super_glue", "super_glue"), config, {"train": "train", "test": "validation"}, _HIDDEN_TEST)


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
    dataset: HubData | None = None
    """The built-in data location, read from the offline cache when no `--data` is given."""
    labels_from_data: bool = False
    """Read the verbalizer from the data: the label column's class names (a `datasets` ClassLabel), in
    label-index order (`task_data.with_data_labels`), for label sets too long to write out (banking77)."""
    spelled: tuple[str, ...] = ()
    """How each label is written in prompts when it differs from `labels` (label remapping,
    `icl_eval.protocol.label_map`); `labels` still reads the data's gold values. Empty: `labels` as written."""

    def __post_init__(self) -> None:
        if not isinstance(self.template, str):
            raise InputError(f"task {self.name!r}: template must be a string, got {self.template!r}")
        slots = template_fields(self.template)
        if slots.count("label") != 1:
            raise InputError(f"task {self.name!r}: the template needs exactly one {{label}} slot: {self.template!r}")
        if not self.labels and not self.choice_fields and not self.labels_from_data:
            raise InputError(f"task {self.name!r}: give `labels` (a verbalizer) or `choice_fields` (multiple choice)")
        for key in ("labels", "spelled", "choice_fields"):
            _check_names(self.name, key, getattr(self, key))
        if self.label_values and len(set(map(str, self.label_values))) != len(self.label_values):
            raise InputError(f"task {self.name!r}: label_values {list(self.label_values)} repeat a value: an item "
                             "with it would have two gold labels; give each value once")

    @property
    def input_fields(self) -> list[str]:
        return [f for f in template_fields(self.template) if f != "label"]

    def n_candidates(self) -> int:
        return len(self.choice_fields) if self.choice_fields else len(self.labels)

    def candidates(self, item: dict[str, Any]) -> list[str]:
        """The answer strings that fill `{label}` for this item, in label-index order."""
        if self.choice_fields:
            return [str(item[self.column(f)]) for f in self.choice_fields]
        return list(self.spelled or self.labels)

    def gold(self, item: dict[str, Any]) -> int:
        """The gold label index of an item; an unknown value is an error naming it."""
        raw = item[self.column(self.label_field, item)]
        values = self.label_values or (tuple(range(self.n_candidates())) if not isinstance(raw, str) else self.labels)
        for i, v in enumerate(values):
            if raw == v or str(raw) == str(v):
                return i
        raise InputError(f"task {self.name!r}: label {raw!r} is not among {list(values)}")

    def fields(self, item: dict[str, Any]) -> dict[str, str]:
        """The template's input fields of an item, as strings."""
        out = {}
        for name in self.input_fields:
            column = self.column(name, item)
            if column not in item:
                raise InputError(f"task {self.name!r}: item has no field {column!r} (has {sorted(item)})")
            out[name] = str(item[column]).strip()
        return out

    def column(self, name: str, item: dict[str, Any] | None = None) -> str:
        """The data column of a template field: its alias, unless the item has the field itself."""
        alias = self.field_aliases.get(name, name)
        return name if item is not None and alias not in item and name in item else alias


def _check_names(task: str, key: str, names: tuple) -> None:
    """Labels (and choice fields) are distinct non-blank strings. Each is a candidate: an empty label
    scores no token (its score is NaN, and NaN wins the argmax), and two equal labels are one candidate
    counted twice, so the accuracy of either is meaningless."""
    bad = [n for n in names if not isinstance(n, str) or not n.strip()]
    if bad:
        raise InputError(f"task {task!r}: {key} must be non-empty strings, got {bad[0]!r} in {_listed(names)}")
    repeated = sorted(n for n, count in Counter(names).items() if count > 1)  # one pass: a million labels in a second
    if repeated:
        raise InputError(f"task {task!r}: {key} {_listed(names)} give {_listed(repeated)} more than once; each label "
                         "is one candidate: give each once")


def _listed(names) -> str:
    """Names as a list in a message, the first few of a long one and how many there are."""
    names = list(names)
    return str(names) if len(names) <= 10 else f"{str(names[:5])[:-1]}, ... ({len(names):,} in all)]"


def template_slots(template: str) -> list[tuple[str, str | None]]:
    """(literal text, slot name or None) pairs of a template, every slot a plain `{name}`.

    A slot is a field name and nothing else: a format spec (`{text:>300000000}` pads every item to
    300 million characters), a conversion (`{label!r}`), an index or attribute (`{text[0]}`) and a
    positional slot (`{}`) are refused here, where the template is read, with what to write instead;
    `{{` and `}}` stay literal braces."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:  # an unmatched brace
        raise InputError(f"template {template!r}: {err}; write a literal brace as {{{{ or }}}}") from None
    out = []
    for literal, name, spec, conversion in parsed:
        if name is not None and (not name.isidentifier() or spec or conversion):
            slot = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise InputError(f"template {template!r}: slot {slot} is not a field name; a slot is {{field}} only "
                             "(no format spec, conversion, index or empty {}), e.g. {text} or {label}")
        out.append((literal, name))
    return out


def template_fields(template: str) -> list[str]:
    return [name for _, name in template_slots(template) if name]


@functools.lru_cache(maxsize=64)
def split_at_label(template: str) -> tuple[str, str]:
    """The template before and after its `{label}` slot, each still a template (literal braces kept
    doubled), so `{{label}}` text before the slot does not split it."""
    halves: tuple[list[str], list[str]] = ([], [])
    side = 0
    for literal, name in template_slots(template):
        halves[side].append(literal.replace("{", "{{").replace("}", "}}"))
        if name == "label":
            side = 1
        elif name:
            halves[side].append("{" + name + "}")
    return "".join(halves[0]), "".join(halves[1])


# The EVALM paper's Table 8 (Appendix C.2): the ten tasks of §4.1, each with the dataset it is
# usually read from (id, config, splits) and that dataset's real column names. `field_aliases`
# maps a template slot to the column where they differ (an item that has the slot's own name is
# read as is, so a local copy with `sentence` still works). COPA's "Correct Answer: {Choices}" is
# scored as multiple choice over the two choices (the table's "false / true" is whether the shown
# choice is the correct one, i.e. the candidate with the highest score is predicted).
_T8 = "EVALM Table 8"
EVALM_TASKS: dict[str, Task] = {
    "sst2": Task("sst2", "{label} Movie Review: {sentence}", ("Negative", "Positive"), source=_T8,
                 dataset=_glue("sst2")),
    "sst5": Task("sst5", "{sentence} It is {label}", ("terrible", "bad", "okay", "good", "great"),
                 field_aliases={"sentence": "text"}, source=_T8,
                 dataset=HubData(("SetFit/sst5",), None, {"train": "train", "validation": "validation", "test": "test"},
                                 "the dataset's labelled validation and test splits are used as such")),
    "mnli": Task(
        "mnli", "{premise} ? {label} , {hypothesis}", ("Yes", "Maybe", "No"),
        source=f"{_T8} (label order follows MNLI: 0 entailment, 1 neutral, 2 contradiction)",
        dataset=_glue("mnli", test="validation_matched"),
    ),
    "trec": Task(
        "trec", "{sentence} It is about {label}",
        ("abbreviation", "entity", "description and abstract concept", "human being", "location", "numeric value"),
        label_field="coarse_label", field_aliases={"sentence": "text"}, source=_T8,
        dataset=HubData(("CogComp/trec", "trec"), None, {"train": "train", "test": "test"}, _LABELLED_TEST),
    ),
    "wic": Task(
        "wic",
        "{sentence1}\n{sentence2}\nquestion: Is the word {word} used in the same way in the two sentences above?\nanswer: {label}",
        ("no", "yes"), source=_T8, dataset=_super_glue("wic"),
    ),
    "multirc": Task(
        "multirc", "Context: {paragraph}\n{question}\n{label} answer: {answer}", ("incorrect", "correct"),
        source=_T8, dataset=_super_glue("multirc"),
    ),
    "boolq": Task(
        "boolq", "Context: {passage}\nQuestion: {question} ?\nanswer: {label}", ("no", "yes"), source=_T8,
        dataset=_super_glue("boolq"),
    ),
    "agnews": Task(
        "agnews", "{text} It is about {label}", ("world", "sports", "business", "technology"), source=_T8,
        dataset=HubData(("fancyzhx/ag_news", "ag_news"), None, {"train": "train", "test": "test"}, _LABELLED_TEST),
    ),
    "wsc": Task(
        "wsc",
        "{text}\nQuestion: In the passage above, what does the pronoun {span2_text} refer to?\nAnswer: {span1_text} "
        "This is a {label} answer.",
        ("false", "true"), source=_T8, dataset=_super_glue("wsc.fixed"),
    ),
    "copa": Task(
        "copa", "Context: {premise}\nCorrect Answer: {label}", choice_fields=("choice1", "choice2"),
        source=f"{_T8} (scored as multiple choice over choice1/choice2)", dataset=_super_glue("copa"),
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

# The ICL tasks of HELMET (Yen et al. 2025) and Bertsch et al. 2025: many labels, where many-shot
# gains are largest. HELMET's item template `{text}\nlabel: {label}` (demonstrations separated by an
# empty line: `--eval.separator=blank-line`), its datasets and splits (clinc150: the validation split
# is scored; nlu: one split, 10% cut off as test with seed 42), and the label names of each
# dataset's ClassLabel column. HELMET spells the labels as shuffled integers: `--label-map int`.
_HELMET = "HELMET ICL (Yen et al. 2025; Bertsch et al. 2025)"
_ITEM = "{text}\nlabel: {label}"
_TREC = HubData(("CogComp/trec", "trec"), None, {"train": "train", "test": "test"}, _LABELLED_TEST)
HELMET_TASKS: dict[str, Task] = {
    "banking77": Task("banking77", _ITEM, labels_from_data=True, source=_HELMET,
                      dataset=HubData(("PolyAI/banking77", "banking77"), None, {"train": "train", "test": "test"},
                                      _LABELLED_TEST)),
    "clinc150": Task("clinc150", _ITEM, label_field="intent", labels_from_data=True, source=_HELMET,
                     dataset=HubData(("clinc_oos",), "plus", {"train": "train", "test": "validation"},
                                     "clinc_oos/plus: its validation split is scored as the test split, as HELMET does")),
    "nlu": Task("nlu", _ITEM, labels_from_data=True, source=_HELMET,
                dataset=HubData(("xingkunliuxtracta/nlu_evaluation_data", "nlu_evaluation_data"), None,
                                {"train": "train", "test": "test"},
                                "one split: 10% cut off as the test split (train_test_split, seed 42), as HELMET does",
                                test_fraction=0.1)),
    "trec_coarse": Task("trec_coarse", _ITEM, label_field="coarse_label", labels_from_data=True, source=_HELMET,
                        dataset=_TREC),
    "trec_fine": Task("trec_fine", _ITEM, label_field="fine_label", labels_from_data=True, source=_HELMET,
                      dataset=_TREC),
}

TEMPLATE_SETS: dict[str, dict[str, Task]] = {"evalm": EVALM_TASKS, "structured": STRUCTURED_TASKS,
                                             "helmet": HELMET_TASKS}


def get_task(name: str, template_set: str = "evalm") -> Task:
    """A built-in task by name, or a user task from a `.toml`/`.yaml` file."""
    if Path(name).suffix in (".toml", ".yaml", ".yml"):
        return read_task_file(name)
    if template_set not in TEMPLATE_SETS:
        raise ConfigError(f"template set {template_set!r} is not known; valid: {sorted(TEMPLATE_SETS)}")
    tasks = TEMPLATE_SETS[template_set]
    if name not in tasks and name in HELMET_TASKS:  # the field's ICL tasks have one template set: their own
        return HELMET_TASKS[name]
    if name not in tasks:
        raise ConfigError(f"task {name!r} has no {template_set!r} template; valid: {sorted(tasks)} or a .toml/.yaml file")
    return tasks[name]


def read_task_file(path: str | Path) -> Task:
    """A user task: a `[task]` table (TOML) or `task:` mapping (YAML) with Task's fields.

    Relative data paths in the file (`train`, `validation`, `test`) are kept in `data_files`
    by `task_data.task_data_files`; this function only builds the Task.
    """
    spec = task_table(path)
    spec = {k: v for k, v in spec.items() if k not in SPLITS and k != "data"}
    where = f"{path}:{_table_line(path)}"
    for key in ("labels", "label_values", "choice_fields"):
        if key in spec and not isinstance(spec[key], list):
            raise InputError(f"{where}: `{key}` must be a list, e.g. {key} = [\"no\", \"yes\"]; got {spec[key]!r}")
        if key in spec:
            spec[key] = tuple(spec[key])
    spec.setdefault("name", Path(path).stem)
    spec.setdefault("source", str(path))
    valid = set(Task.__dataclass_fields__)
    unknown = sorted(set(spec) - valid)
    if unknown:
        raise InputError(f"{where}: unknown task key(s) {unknown}; valid: {sorted(valid | set(SPLITS) | {'data'})}")
    if "template" not in spec:
        raise InputError(f"{where}: the task has no `template`; add one with the input fields and one {{label}} slot, "
                         "e.g. template = \"Review: {text} Sentiment: {label}\"")
    try:
        return Task(**spec)
    except ValueError as err:  # the file and line of the table, then what is wrong with it
        raise InputError(f"{where}: {err}") from None


def _table_line(path: str | Path) -> int:
    """The line of the `[task]` table (TOML) or `task:` key (YAML): where a missing key belongs."""
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if line.strip().replace(" ", "") in ("[task]", "task:"):
            return number
    return 1


def task_table(path: str | Path) -> dict[str, Any]:
    """The `[task]` table of a task file; the file's split names (`train = "train.jsonl"`) must be strings."""
    path = Path(path)
    raw = read_bounded(path, MAX_CONFIG_BYTES, "a task file")  # a FIFO hung, a link to /dev/zero filled memory
    data = parse_toml(raw, str(path)) if path.suffix == ".toml" else read_yaml(raw, path)
    if not isinstance(data, dict) or not isinstance(data.get("task"), dict):
        raise InputError(f"{path}: expected a [task] table (TOML) or a `task:` mapping (YAML)")
    table = dict(data["task"])
    odd = [key for key in (*SPLITS, "data") if key in table and not isinstance(table[key], str)]
    if odd:
        raise InputError(f"{path}: `{odd[0]}` must name a file or folder as a string, e.g. train = \"train.jsonl\"; "
                         f"got {table[odd[0]]!r}")
    return table
