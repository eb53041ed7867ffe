"""Configs of the three stages: frozen dataclasses validated by pydantic, read from TOML.

A data config file holds up to three sections, `[filter]`, `[dedup]`, `[blend]` (or the same
under `[data]` in a project config). Each stage receives only its own section. Unknown keys are
refused before pydantic sees them, with the file, the section, the key and the valid keys.
Configs are data: thresholds, paths and names, never code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic.dataclasses import dataclass

from evalm.config_toolkit import FROZEN, ConfigError, build, check_sections, read_toml

# docs/data_pipeline.md: the ten Pile subsets EVALM keeps (Appendix A.1), in survivor priority order.
PILE_SUBSETS = (
    "Wikipedia (en)",
    "Gutenberg (PG-19)",
    "BookCorpus2",
    "Books3",
    "OpenWebText2",
    "USPTO Backgrounds",
    "HackerNews",
    "OpenSubtitles",
    "DM Mathematics",
    "Pile-CC",
)
Compression = Literal["zstd", "gzip", "none"]


@dataclass(config=FROZEN, frozen=True)
class FilterProfile:
    """Thresholds of the six quality filters (docs/data_pipeline.md, BLOOM's `en` parameters); each is the
    `low` or `high` bound named by an entry of data_pipeline.filters.FILTERS."""

    min_words: int = 20
    """Filter 1: fewer words than this is `word_count`."""
    max_words: int = 100_000
    """Filter 1: more words than this is `word_count`."""
    max_char_repetition: float = 0.106
    """Filter 2: share of the most repeated character 10-grams."""
    max_word_repetition: float = 0.19
    """Filter 3: share of word 5-gram occurrences that repeat."""
    max_special_ratio: float = 0.40
    """Filter 4: share of punctuation, digits and whitespace among characters."""
    min_stopword_ratio: float = 0.30
    """Filter 5: share of stop words among normalised words."""
    max_flagged_ratio: float = 0.01
    """Filter 6: share of flagged words among normalised words."""


# DM Mathematics: question/answer lines score ~0.6 special characters and few stop words
# (docs/data_pipeline.md). Provisional cutoffs: tune from the histograms in stats/ on real shards.
_DM_MATHEMATICS = {"max_special_ratio": 1.0, "min_stopword_ratio": 0.05, "max_word_repetition": 0.5}


@dataclass(config=FROZEN, frozen=True)
class FilterConfig:
    subsets: tuple[str, ...] = PILE_SUBSETS
    """Catalogue filter: documents of other subsets are rejected with reason `subset`."""
    default: FilterProfile = FilterProfile()
    """Thresholds for every kept subset without an override."""
    overrides: dict[str, dict[str, float]] = dataclasses.field(
        default_factory=lambda: {"DM Mathematics": dict(_DM_MATHEMATICS)}
    )
    """Per-subset threshold overrides, `{subset: {field of FilterProfile: value}}`."""
    stopwords: str = ""
    """Path of the stop-word list; '' = the shipped en_stopwords.txt."""
    flagged_words: str = ""
    """Path of the flagged-word list; '' = the shipped en_flagged.txt."""
    char_ngram: int = 10
    """n of the character repetition filter."""
    word_ngram: int = 5
    """n of the word repetition filter."""
    max_error_fraction: float = 0.01
    """A task fails (after writing its errors file) when bad records exceed this share."""
    compression: Compression = "zstd"
    """Output compression; zstd and none are byte-reproducible, gzip stores a timestamp."""

    def __post_init__(self) -> None:
        valid = [f.name for f in dataclasses.fields(FilterProfile)]
        for subset, values in self.overrides.items():
            if subset not in self.subsets:
                raise ConfigError(f"overrides: subset {subset!r} is not kept; kept subsets: {list(self.subsets)}")
            unknown = sorted(set(values) - set(valid))
            if unknown:
                raise ConfigError(f"overrides.{subset!r}: unknown key(s) {unknown}; valid keys: {valid}")
            self.profile(subset)  # each override's values checked now, not in the middle of a task
        if not 0.0 <= self.max_error_fraction <= 1.0:
            raise ConfigError("max_error_fraction must lie in [0, 1]")
        for name in ("char_ngram", "word_ngram"):  # 0 would count empty n-grams: every document "repetitive"
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")

    def profile(self, subset: str) -> FilterProfile:
        return dataclasses.replace(self.default, **self.overrides.get(subset, {}))


@dataclass(config=FROZEN, frozen=True)
class DedupConfig:
    """Fuzzy dedup parameters (docs/data_pipeline.md; derivation of bands x rows in lsh.py)."""

    num_perm: int = 128
    """MinHash permutations."""
    seed: int = 1
    """Seed of datasketch's permutations; stored with every fingerprint."""
    scheme: Literal["affine32"] = "affine32"
    """datasketch 2.x permutation scheme (the default since 2.0); the fast path implements it."""
    bands: int = 8
    """LSH bands b (explicit: datasketch's optimiser picks 3 x 42, recall 0.31 at J = 0.95)."""
    rows: int = 16
    """LSH rows per band r."""
    threshold: float = 0.95
    """Candidates are kept as edges only if their exact token-set Jaccard is above this."""
    priority: tuple[str, ...] = PILE_SUBSETS
    """Survivor of a component: first subset here, then longer text, then smaller id."""
    max_error_fraction: float = 0.01
    """As in FilterConfig."""
    compression: Compression = "zstd"

    def __post_init__(self) -> None:
        if self.bands < 2 or self.rows < 1 or self.bands * self.rows > self.num_perm:
            raise ConfigError(f"bands x rows = {self.bands} x {self.rows} must be <= num_perm={self.num_perm}, bands >= 2")
        if len(set(self.priority)) != len(self.priority):
            raise ConfigError("priority lists a subset twice")
        if not 0.0 < self.threshold <= 1.0:
            raise ConfigError("threshold must lie in (0, 1]")


@dataclass(config=FROZEN, frozen=True)
class BlendConfig:
    seed: int = 1234
    """Seed of the document sampling and of the shard shuffle."""
    bytes_per_token: float = 4.0
    """Token estimate = UTF-8 bytes / this (GPT-2 BPE on English is close to 4); the blend runs
    before tokenisation, so budgets are met up to this estimate."""
    compression: Compression = "zstd"
    max_error_fraction: float = 0.01


@dataclass(config=FROZEN, frozen=True)
class Budgets:
    """Per-subset token budgets (a budgets file; Table 5 of EVALM is budgets/table5.toml)."""

    tokens: dict[str, float]
    """Budget per subset, in `unit` tokens (absolute) or as proportions (relative)."""
    unit: float = 1e9
    """Tokens per budget unit (Table 5 counts billions)."""
    scale: float = 1.0
    """Multiplies every absolute budget (e.g. 1e-6 for a laptop-sized blend)."""
    relative: bool = False
    """True: budgets are proportions among the subsets the data has (absent ones get 0), scaled
    to the largest blend the data allows without repeating any subset."""
    overflow: Literal["upsample", "cap"] = "upsample"
    """A subset with fewer tokens than its budget is repeated (epochs > 1) or capped."""
    max_epochs: float = 100.0
    """The most copies of a subset's documents an upsampled blend may take. Table 5's billions on a
    sample of a few documents would be millions of copies of each (a plan too large for memory), never
    what was meant: past this the blend is refused and the error says how to scale the budgets."""

    def __post_init__(self) -> None:
        if not self.tokens or any(v < 0 for v in self.tokens.values()):
            raise ConfigError("tokens must list at least one subset with a budget >= 0")
        if self.max_epochs < 1:
            raise ConfigError(f"max_epochs must be >= 1, got {self.max_epochs}")


SECTIONS: dict[str, type] = {"filter": FilterConfig, "dedup": DedupConfig, "blend": BlendConfig}


def load_stage(stage: str, path: str | Path | None) -> Any:
    """The config of one stage from a data config file (or the defaults when path is None)."""
    if path is None:
        return SECTIONS[stage]()
    data = read_toml(path)
    if isinstance(data.get("data"), Mapping):
        data, prefix = data["data"], "data."
    else:
        prefix = ""
    check_sections(data, list(SECTIONS), f"{path} [data]" if prefix else str(path))
    return build(SECTIONS[stage], data.get(stage), where=f"{path} [{prefix}{stage}]")


def load_budgets(path: str | Path) -> Budgets:
    return build(Budgets, read_toml(path), where=str(path))
