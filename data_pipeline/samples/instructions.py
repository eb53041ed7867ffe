"""Instruction records from promptsource's templates (and two of ours) over the tasks' train splits.

The ground floor yields (task, input, output) records; the row format `evalm train msit` reads is
train's, written by the `write` passed in (`train.instructions`, composed by launcher.samples).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from evalm.data_pipeline.samples.archive import Archive
from evalm.data_pipeline.samples.packages import PROMPTS
from evalm.data_pipeline.samples.records import Output, Provenance
from evalm.data_pipeline.samples.tasks import TASKS, Items, Splits

INSTRUCTIONS_PER_TASK = 1500
OWN_SUBJ = ["{text}\nIs this sentence objective or subjective? ||| {answer}",
            "Does the following sentence state facts about a plot, or an opinion?\n{text} ||| {answer}"]
OWN_TITLE = ["Write a headline for this article:\n{text} ||| {answer}",
             "{text}\n\nWhat is a good title for this news story? ||| {answer}"]

Instruction = tuple[str, str, str]
"""(task, input, output)."""
Render = Callable[[dict, int], "tuple[str, str] | None"]
WriteInstructions = Callable[[Path, list[Instruction]], None]
"""(file, records) -> None: the upper floor's row format."""


def render_promptsource(jinja: str, text: str, choices: Sequence[str], label: int) -> tuple[str, str] | None:
    """(input, output) of a promptsource template that only uses {{text}}, {{"literal"}} and
    {{answer_choices[label]}}; None for any other template (no Jinja dependency)."""
    if "{%" in jinja or "|||" not in jinja:
        return None
    def slot(m: re.Match) -> str:
        inner = m.group(1).strip()
        if inner == "text":
            return text
        if re.fullmatch(r'"[^"]*"', inner):
            return inner[1:-1]
        if re.fullmatch(r"answer_choices\s*\[\s*label\s*\]", inner):
            return choices[label]
        raise KeyError(inner)
    try:
        rendered = re.sub(r"\{\{(.*?)\}\}", slot, jinja, flags=re.S)
    except KeyError:
        return None
    prompt, answer = rendered.split("|||", 1)
    return prompt.strip(), answer.strip()


def promptsource_templates(arc: Archive, dataset: str) -> list[dict[str, Any]]:
    import yaml  # present through huggingface-hub (datatrove); only needed here

    class Loader(yaml.SafeLoader):
        pass

    for tag in ("!Template", "!TemplateMetadata"):
        Loader.add_constructor(tag, lambda loader, node: loader.construct_mapping(node, deep=True))
    data = yaml.load(arc.text(f"{PROMPTS}{dataset}/templates.yaml"), Loader=Loader)
    return [data["templates"][k] for k in sorted(data["templates"])]


def _rt(templates: list[dict], item: dict, i: int) -> tuple[str, str] | None:
    """Cycle through the rotten_tomatoes templates, each with its own answer choices."""
    for k in range(len(templates)):
        t = templates[(i + k) % len(templates)]
        choices = [c.strip() for c in t.get("answer_choices", "").split("|||")]
        if len(choices) == 2:
            pair = render_promptsource(t["jinja"], item["text"], choices, item["label"])
            if pair:
                return pair
    return None


def by_templates(templates: list[dict], choices: Sequence[str]) -> Render:
    """Cycle through the promptsource templates this renderer can fill, with fixed answer choices."""
    usable = [t for t in templates if render_promptsource(t["jinja"], "x", choices, 0)]
    if not usable:
        return lambda it, i: None
    return lambda it, i: render_promptsource(usable[i % len(usable)]["jinja"], it["text"], choices, it["label"])


def own(templates: list[str], answer: Callable[[dict], str]) -> Render:
    """Cycle through our own `prompt ||| {answer}` templates."""
    def render(it: dict, i: int) -> tuple[str, str]:
        prompt, out = templates[i % len(templates)].format(text=it["text"], answer=answer(it)).split("|||")
        return prompt.strip(), out.strip()
    return render


def plan(ps: Archive, tasks: dict[str, Splits]) -> list[tuple[str, Items, Render, tuple[str, str, str]]]:
    """(instruction task, items, renderer, source) in writing order. Train splits only: the
    evaluation tasks' validation/test items never appear here."""
    rt_templates = promptsource_templates(ps, "rotten_tomatoes")
    news_templates = [t for t in promptsource_templates(ps, "ag_news")
                      if not t.get("metadata", {}).get("choices_in_prompt", True)]
    topics = [x.title() for x in TASKS["bbc_news"].labels]
    return [
        ("sentiment_rt", tasks["rotten_tomatoes"]["train"], lambda it, i: _rt(rt_templates, it, i),
         ("promptsource", f"{PROMPTS}rotten_tomatoes/templates.yaml", "templates rendered on rotten_tomatoes train")),
        ("topic_bbc", tasks["bbc_news"]["train"], by_templates(news_templates, topics),
         ("promptsource", f"{PROMPTS}ag_news/templates.yaml",
          "ag_news templates without choices in the prompt, answer choices = BBC topics; bbc_news train")),
        ("title_bbc", tasks["bbc_news"]["train"], own(OWN_TITLE, lambda it: it["title"]),
         ("samples.py", "own templates", "headline generation on bbc_news train")),
        ("subj", tasks["subj"]["train"], own(OWN_SUBJ, lambda it: it["label_text"]),
         ("samples.py", "own templates", "subj train")),
    ]


def write_instructions(output: Output, ps: Archive, tasks: dict[str, Splits], rng: random.Random,
                       write: WriteInstructions, row_format: str) -> dict[str, int]:
    """instructions/train.jsonl through `write`, shuffled; returns the records per task."""
    rows: list[Instruction] = []
    counts, prov = {}, Provenance()
    for task, items, render, source in plan(ps, tasks):
        made = 0
        for i, it in enumerate(items[:INSTRUCTIONS_PER_TASK]):
            pair = render(it, i)
            if pair:
                rows.append((task, *pair))
                made += 1
        counts[task] = made
        prov.add(*source, n=made)
    rng.shuffle(rows)
    rel = "instructions/train.jsonl"
    write(output.root / rel, rows)
    output.record(rel, prov, records=len(rows), per_task=counts, format=row_format)
    return counts
