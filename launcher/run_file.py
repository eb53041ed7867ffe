"""The run file of `evalm run`: its sections, validated, and the folders and models they imply.

    [run] name, root, samples, workers, data_tasks, jobs   where the run lives, how wide the jobs are
    [data] [tokenizer] [pretrain] [msit] [twins]         each stage's settings and extra arguments
    [[eval]] [ppl] [recall]                              what is evaluated, on which models

Every section is a frozen dataclass validated by `evalm.config.build` (unknown keys name the file,
the section and the valid keys); `load_run` checks what spans sections (unique eval names, known models).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import field
from pathlib import Path

from pydantic.dataclasses import dataclass

from evalm.config_toolkit import (FROZEN, ConfigError, apply_overrides, build, check_overrides, check_sections, read_toml,
                                  shipped)


@dataclass(config=FROZEN, frozen=True)
class RunSection:
    """`[run]`: where the run lives and how wide the data jobs are."""

    name: str = "tiny"
    """Run folder name: outputs go to ROOT/NAME/<stage>/."""
    root: str = "runs"
    """Parent folder of runs."""
    samples: str = "data/samples"
    """Folder of `evalm data samples` (built, from pinned PyPI packages, when missing)."""
    workers: int = 2
    """Data tasks run at once (local executor)."""
    data_tasks: int = 2
    """Tasks of each data stage (fixed for a run folder)."""
    jobs: int = 2
    """Steps run at once, each a child process with cores // jobs threads, started when the steps it
    reads from are done (launcher/schedule.py); 1: one after another in this process. A step's floats
    depend on its threads, so the same run file on the same machine gives the same figures."""
    seed: int | None = None
    """Training seed of every training stage (pretrain, msit, the twins), set as `train.seed` (weight
    init, dropout) and `data.seed` (line order) after the stage's own `set`; unset, each training
    config's own seeds. Another seed is another training trajectory: the spread of the front table
    (docs/results.md) is over seeds, e.g. `evalm run --set run.seed=2 --set run.name=tiny-seed2`."""


@dataclass(config=FROZEN, frozen=True)
class DataSection:
    """`[data]`: extra arguments of `evalm data filter|dedup|blend` (e.g. --config, --redis-url)."""

    filter: list[str] = field(default_factory=list)
    dedup: list[str] = field(default_factory=list)
    blend: list[str] = field(default_factory=list)


@dataclass(config=FROZEN, frozen=True)
class TokenizerSection:
    """`[tokenizer]`: the byte-level BPE trained on the blended documents."""

    vocab_size: int = 1024
    """Also set as model.vocab_size of pretraining and tuning."""
    args: list[str] = field(default_factory=list)


@dataclass(config=FROZEN, frozen=True)
class TrainSection:
    """`[pretrain]` / `[msit]`: a run file of `evalm train` plus `--set` overrides."""

    config: str = "configs/pretrain-tiny.toml"
    set: list[str] = field(default_factory=list)
    """`section.key=value` overrides, e.g. "train.steps=200"."""
    synthetic_episodes: int = 0
    """MSIT only: synthetic in-context episodes (one fresh rule each) added to the tuning data."""
    synthetic_examples: int = 160
    """MSIT only: examples per synthetic episode (about one packed line each)."""
    synthetic_inputs: list[int] = field(default_factory=lambda: [16])
    """MSIT only: rule sizes (inputs per episode) the synthetic episodes cycle through; smaller rules
    let the recall circuit form early (`evalm train msit-data --inputs`)."""
    sample_instructions: int = 0
    """MSIT only: rows taken from the samples' instructions/train.jsonl."""


@dataclass(config=FROZEN, frozen=True)
class TwinsSection:
    """`[twins]`: the baselines EVALM compares EVA with, trained on the same data, steps and seed.

    `full` is a full-attention twin (pretrain + msit, then ICL beside EVA: EVALM's EVA-vs-exact
    comparison); `absolute` a pretraining twin with learned absolute positions (perplexity past the
    training length beside circular positions: EVALM §3.1, Figure 4). Each is a list of `--set`
    overrides on top of the EVA run's; an empty list turns the twin off."""

    full: list[str] = field(default_factory=lambda: ["model.attention=full"])
    absolute: list[str] = field(default_factory=lambda: ["model.positions=absolute"])


@dataclass(config=FROZEN, frozen=True)
class EvalEntry:
    """One `[[eval]]` entry: `evalm eval icl` on a task with extra arguments."""

    name: str
    task: str = "synthetic"
    """`synthetic`, a built-in task name, or a task file relative to the samples folder."""
    models: list[str] = field(default_factory=lambda: ["msit"])
    """Exported models to evaluate (see `MODELS`), each into icl/NAME/MODEL/."""
    args: list[str] = field(default_factory=list)


@dataclass(config=FROZEN, frozen=True)
class PplSection:
    """`[ppl]`: `evalm eval ppl` on the samples' books (PG-19 layout) with extra arguments."""

    books: str = "books"
    """Folder of .txt books, relative to the samples folder."""
    models: list[str] = field(default_factory=lambda: ["pretrain", "msit"])
    """Exported models to evaluate (see `MODELS`), each into ppl/MODEL/; the unigram reference is
    fitted on the run's own token shards."""
    args: list[str] = field(default_factory=list)


@dataclass(config=FROZEN, frozen=True)
class RecallSection:
    """`[recall]`: `evalm eval recall` through each model's cache at multiples of the training length
    (the pretrain stage's `data.seq_len`), so a paper-scale run file reads at its own scale."""

    models: list[str] = field(default_factory=lambda: ["pretrain", "full-pretrain", "absolute-pretrain"])
    """Exported models to evaluate (see `MODELS`), each into recall/MODEL/: EVA and its twins."""
    multiples: list[int] = field(default_factory=lambda: [1, 4, 16])
    """Prompt lengths as multiples of the training length."""
    tasks: list[str] = field(default_factory=lambda: ["passkey"])
    """Recall families (`evalm eval recall --tasks`)."""
    args: list[str] = field(default_factory=list)
    """Extra arguments (depths, seeds, items: `evalm eval recall`'s own defaults otherwise)."""


@dataclass(frozen=True)
class Run:
    """The resolved run: every section plus the folders it implies."""

    path: Path
    run: RunSection
    data: DataSection
    tokenizer: TokenizerSection
    pretrain: TrainSection
    msit: TrainSection
    twins: TwinsSection
    evals: list[EvalEntry]
    ppl: PplSection
    recall: RecallSection = RecallSection()

    @property
    def dir(self) -> Path:
        return Path(self.run.root) / self.run.name

    @property
    def samples(self) -> Path:
        return Path(self.run.samples)

    def stage_dir(self, stage: str) -> Path:
        return self.dir / stage


MODELS: dict[str, tuple[str, ...]] = {
    "pretrain": ("pretrain",),
    "msit": ("msit",),
    "full-pretrain": ("twins", "full", "pretrain"),
    "full-msit": ("twins", "full", "msit"),
    "absolute-pretrain": ("twins", "absolute", "pretrain"),
}
"""Models a run can evaluate: name -> training folder under the run; exported to export/NAME/."""


def trained_models(r: Run) -> list[str]:
    """The models this run trains (twins switched off in [twins] are absent)."""
    return [m for m in MODELS if not (m.startswith("full") and not r.twins.full)
            and not (m.startswith("absolute") and not r.twins.absolute)]


def _shipped_config(section: TrainSection) -> TrainSection:
    """The section with its run file resolved (`configs/NAME` falls back to the shipped one), so the
    stage commands and keys name a file that exists from any working directory."""
    return dataclasses.replace(section, config=str(shipped(section.config)))


SECTIONS = {"run": RunSection, "data": DataSection, "tokenizer": TokenizerSection, "pretrain": TrainSection,
            "msit": TrainSection, "twins": TwinsSection, "ppl": PplSection, "recall": RecallSection}
"""The run file's sections a `--set` may name ([[eval]] is a list: its entries are the file's own)."""


def load_run(path: str | Path, overrides: Sequence[str] = (), raw: dict | None = None) -> Run:
    """The run file (`raw`: its tables, when the caller has read it) with `section.key=value` overrides
    (`evalm run --set`) on top; a misspelled override is the flag's mistake, named as such, not the file's."""
    check_overrides(overrides, SECTIONS)
    data = apply_overrides(read_toml(path) if raw is None else raw, overrides)
    known = {"run", "data", "tokenizer", "pretrain", "msit", "twins", "eval", "ppl", "recall"}
    check_sections(data, sorted(known), str(path))
    evals = [build(EvalEntry, e, where=f"{path} [[eval]] #{i + 1}") for i, e in enumerate(data.get("eval", []))]
    names = [e.name for e in evals]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: [[eval]] names must be unique, got {names}")
    for where, models in [*((f"[[eval]] {e.name}", e.models) for e in evals), ("[ppl]", data.get("ppl", {}).get("models", [])),
                          ("[recall]", data.get("recall", {}).get("models", []))]:
        unknown = sorted(set(models) - set(MODELS))
        if unknown:
            raise ConfigError(f"{path} {where}: unknown model(s) {unknown}; valid: {list(MODELS)}")
    data_args = {k: [str(shipped(a)) for a in v] for k, v in data.get("data", {}).items()}
    run = build(RunSection, data.get("run"), where=f"{path} [run]")
    if run.jobs < 1:
        raise ConfigError(f"{path} [run]: jobs = {run.jobs}; give 1 (one step at a time) or more")
    return Run(
        path=Path(path),
        run=run,
        data=build(DataSection, data_args, where=f"{path} [data]"),
        tokenizer=build(TokenizerSection, data.get("tokenizer"), where=f"{path} [tokenizer]"),
        pretrain=_shipped_config(build(TrainSection, data.get("pretrain"), where=f"{path} [pretrain]")),
        msit=_shipped_config(build(TrainSection, {"config": "configs/msit-tiny.toml", **data.get("msit", {})},
                                   where=f"{path} [msit]")),
        twins=build(TwinsSection, data.get("twins"), where=f"{path} [twins]"),
        evals=evals,
        ppl=build(PplSection, data.get("ppl"), where=f"{path} [ppl]"),
        recall=build(RecallSection, data.get("recall"), where=f"{path} [recall]"),
    )
