"""`evalm data filter`: catalogue filter, normalisation, six quality filters (docs/data_pipeline.md).

Steps: `filter` (N tasks, one per group of input files) then `manifest`. Outputs per task:
documents/<rank>.jsonl.zst (kept, normalised), rejected/<rank>.jsonl.zst (with `filter_reason`
and the ratio values), errors/<rank>.jsonl (bad input records), stats/filter/<rank>.json.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from datatrove.pipeline.base import PipelineStep

from evalm.config_toolkit import to_dict
from evalm.data_pipeline import filters, wordlists
from evalm.data_pipeline.config import FilterConfig
from evalm.data_pipeline.document import Document
from evalm.data_pipeline.normalize import normalize
from evalm.data_pipeline.runner import Manifest, Step, merge_counts, reader, task_stats, write_errors, write_json, writer

BINS = 20  # histogram bins over [0, 1] for the ratios; word counts use log10 bins over [0, 6]


@dataclass(frozen=True, slots=True)
class Verdict:
    doc: Document
    reason: str | None
    ratios: filters.Ratios | None
    """One value per filter of the table that judged it (None for a dropped subset)."""
    chars_removed: int


def word_lists(config: FilterConfig) -> tuple[frozenset[str], frozenset[str]]:
    stop = config.stopwords or wordlists.DEFAULT_STOPWORDS
    flagged = config.flagged_words or wordlists.DEFAULT_FLAGGED
    return (
        wordlists.load(stop, normalize_word=filters.normalize_word),
        wordlists.load(flagged, normalize_word=filters.normalize_word),
    )


def filter_documents(
    docs: Iterable[Document], config: FilterConfig, stopwords: frozenset[str], flagged: frozenset[str],
    table: tuple[filters.Filter, ...] = filters.FILTERS,
) -> Iterator[Verdict]:
    """The stage as a pure function: a verdict (kept when reason is None) for every document,
    judged by the filters of `table` (filters.FILTERS)."""
    kept_subsets = set(config.subsets)
    for doc in docs:
        if doc.subset not in kept_subsets:
            yield Verdict(doc, "subset", None, 0)
            continue
        text, removed = normalize(doc.text)
        doc.text = text
        r = filters.ratios(text, stopwords, flagged, config.char_ngram, config.word_ngram, table)
        yield Verdict(doc, filters.reject_reason(r, config.profile(doc.subset), table), r, removed)


class TaskStats:
    """Counts per reason per subset, characters removed, ratio histograms per subset."""

    def __init__(self) -> None:
        self.docs_in: Counter = Counter()
        self.kept: Counter = Counter()
        self.dropped: dict[str, Counter] = {}
        self.chars_removed: Counter = Counter()
        self.histograms: dict[str, dict[str, np.ndarray]] = {}

    def add(self, v: Verdict) -> None:
        s = v.doc.subset or "(none)"
        self.docs_in[s] += 1
        self.chars_removed[s] += v.chars_removed
        if v.reason is None:
            self.kept[s] += 1
        else:
            self.dropped.setdefault(s, Counter())[v.reason] += 1
        if v.ratios is not None:
            values = asdict(v.ratios)
            hist = self.histograms.setdefault(s, {name: np.zeros(BINS, dtype=np.int64) for name in values})
            for name, value in values.items():
                x = np.log10(max(value, 1)) / 6 if name == "word_count" else value
                hist[name][min(int(x * BINS), BINS - 1)] += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "documents_in": dict(self.docs_in),
            "documents_kept": dict(self.kept),
            "dropped": {s: dict(c) for s, c in self.dropped.items()},
            "chars_removed": dict(self.chars_removed),
            "histograms": {s: {k: v.tolist() for k, v in h.items()} for s, h in self.histograms.items()},
        }


class FilterStep(PipelineStep):
    name = "filter"

    def __init__(self, output: str, config: FilterConfig):
        super().__init__()
        self.output, self.config = output, config

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        output = Path(self.output)
        stopwords, flagged = word_lists(self.config)
        source = reader(output)
        stats = TaskStats()
        kept, rejected = writer(output, "documents", self.config.compression), writer(output, "rejected", self.config.compression)
        with kept, rejected:
            for v in filter_documents(source.run(None, rank, world_size), self.config, stopwords, flagged):
                stats.add(v)
                if v.reason is None:
                    kept.write(v.doc, rank)
                    self.stat_update("kept")
                else:
                    v.doc.annotations["filter_reason"] = v.reason
                    if v.ratios is not None:
                        v.doc.annotations["filter_ratios"] = asdict(v.ratios)
                    rejected.write(v.doc, rank)
                    self.stat_update(f"dropped_{v.reason}")
        write_errors(output, rank, source.errors, source.records, self.config.max_error_fraction)
        write_json(output / "stats" / "filter" / f"{rank:05d}.json", {**stats.as_dict(), "errors": len(source.errors)})


def summarize(output: Path) -> dict[str, Any]:
    return {"stats": merge_counts(task_stats(output, "filter"))}


def steps(output: Path, config: FilterConfig, tasks: int) -> list[Step]:
    return [Step("filter", tasks, FilterStep(str(output), config)), Step("manifest", 1, Manifest(str(output), summarize))]


def settings(config: FilterConfig) -> dict[str, Any]:
    stop = config.stopwords or wordlists.DEFAULT_STOPWORDS
    flagged = config.flagged_words or wordlists.DEFAULT_FLAGGED
    return {
        "config": to_dict(config),
        "wordlists": {"stopwords": wordlists.provenance(stop), "flagged_words": wordlists.provenance(flagged)},
    }
