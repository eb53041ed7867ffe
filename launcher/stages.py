"""The stage table of `evalm run`: each stage's steps (one command each), built from the command table `evalm` dispatches.

Stages exchange files, never objects: each step is the same command a user runs as a separate job
(`evalm data filter`, `evalm train msit-data`, `evalm train pretrain`, ...), written here with
`launcher.commands.argv` with the run's folders wired in and the run file's extra arguments
appended. `twins` trains the baselines EVALM compares EVA with on the same data, steps and seed
(full attention; learned absolute positions), `export` writes every model to export/NAME/, and
`icl` / `ppl` / `recall` evaluate the models each entry names (resumable by unit: `icl_eval.protocol.units`).

Each step (`launcher.runner.Step`) names the steps whose outputs it reads (`Step.needs`), so
`launcher.schedule` can run the steps that do not depend on each other at once (`[run] jobs`): the twins train beside EVA, and every
evaluation of a model starts when its export is written.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from evalm.launcher.commands import argv
from evalm.launcher.run_file import MODELS, Run, trained_models
from evalm.launcher.runner import Step  # noqa: F401 - the stage table's noun, re-exported


SYNTHETIC_SEED = 10**6
"""Seed of the tuning data's synthetic rules, far from the evaluation episodes' small seeds."""


def _data_stage(name: str, source: Callable[[Run], Path], after: tuple[str, ...]) -> Callable[[Run], list[Step]]:
    def steps(r: Run) -> list[Step]:
        return [Step(name, argv("data", name, "--input", source(r), "--output", r.stage_dir(name), "--tasks",
                                r.run.data_tasks, "--workers", r.run.workers, *getattr(r.data, name)), after)]

    return steps


def _tokenizer(r: Run) -> list[Step]:
    return [Step("tokenizer", argv("train", "tokenizer", "--input", r.stage_dir("blend"), "--output",
                                   r.stage_dir("tokenizer"), "--vocab-size", r.tokenizer.vocab_size,
                                   *r.tokenizer.args), ("blend",))]


def _train_command(command: str, config: str, out: Path, sets: Sequence[str]) -> list:
    return argv("train", command, "--config", config, "--out", out, "--resume", "auto",
                *(arg for s in sets for arg in ("--set", s)))


def _seed_sets(r: Run) -> list[str]:
    """`[run] seed`, last so that it wins over the stage's own `set` (init, dropout and line order)."""
    return [] if r.run.seed is None else [f"train.seed={r.run.seed}", f"data.seed={r.run.seed}"]


def _pretrain_sets(r: Run) -> list[str]:
    return [f"data.shards={r.stage_dir('tokenizer')}", f"model.vocab_size={r.tokenizer.vocab_size}", *r.pretrain.set,
            *_seed_sets(r)]


def msit_data_file(r: Run) -> Path:
    """The tuning rows the msit stage writes and tunes on (the twins' msit reads them too)."""
    return r.stage_dir("msit") / "data" / "train.jsonl"


def _msit_sets(r: Run, init_from: Path) -> list[str]:
    return [f"data.train_file={msit_data_file(r)}",
            f"data.tokenizer={r.stage_dir('tokenizer') / 'tokenizer.json'}", f"data.pretrain_shards={r.stage_dir('tokenizer')}",
            f"checkpoint.init_from={init_from}", f"model.vocab_size={r.tokenizer.vocab_size}", *r.msit.set,
            *_seed_sets(r)]


def _pretrain(r: Run) -> list[Step]:
    return [Step("pretrain", _train_command("pretrain", r.pretrain.config, r.stage_dir("pretrain"), _pretrain_sets(r)),
                 ("tokenizer",))]


def _msit_data(r: Run) -> list:
    """`evalm train msit-data`: the synthetic episodes of [msit], then the samples' instruction rows."""
    m = r.msit
    args = ["--out", msit_data_file(r), "--episodes", m.synthetic_episodes, "--examples", m.synthetic_examples,
            "--inputs", ",".join(map(str, m.synthetic_inputs)), "--seed", SYNTHETIC_SEED]
    source = r.samples / "instructions" / "train.jsonl"
    if m.sample_instructions and source.is_file():
        args += ["--instructions", source, "--instructions-limit", m.sample_instructions]
    return argv("train", "msit-data", *args)


def _msit(r: Run) -> list[Step]:
    """The rows (read from the samples only) and the tuning of the pretrained model on them."""
    return [Step("msit-data", _msit_data(r)),
            Step("msit", _train_command("msit", r.msit.config, r.stage_dir("msit"), _msit_sets(r, r.stage_dir("pretrain"))),
                 ("pretrain", "msit-data"))]


def _twins(r: Run) -> list[Step]:
    """The same recipe with the twin's overrides last (same data, steps and seed); the full twin tunes on
    the msit stage's rows."""
    steps = []
    if r.twins.full:
        full = r.stage_dir("twins") / "full"
        steps.append(Step(_training_step("full-pretrain"), _train_command(
            "pretrain", r.pretrain.config, full / "pretrain", [*_pretrain_sets(r), *r.twins.full]), ("tokenizer",)))
        steps.append(Step(_training_step("full-msit"), _train_command(
            "msit", r.msit.config, full / "msit", [*_msit_sets(r, full / "pretrain"), *r.twins.full]),
            (_training_step("full-pretrain"), "msit-data")))
    if r.twins.absolute:
        steps.append(Step(_training_step("absolute-pretrain"), _train_command(
            "pretrain", r.pretrain.config, r.stage_dir("twins") / "absolute" / "pretrain",
            [*_pretrain_sets(r), *r.twins.absolute]), ("tokenizer",)))
    return steps


def _training_step(model: str) -> str:
    """The step that trains a model of `MODELS`: its folder under the run, dotted (twins.full.msit)."""
    return ".".join(MODELS[model])


def _export(r: Run) -> list[Step]:
    return [Step(f"export.{m}", argv("export", "--checkpoint", r.dir.joinpath(*MODELS[m]), "--out", r.stage_dir("export") / m),
                 (_training_step(m),))
            for m in trained_models(r)]


def _icl(r: Run) -> list[Step]:
    return [Step(f"icl.{e.name}.{m}", argv(
        "eval", "icl", "--checkpoint", r.stage_dir("export") / m, "--out", r.stage_dir("icl") / e.name / m, "--task",
        e.task if e.task == "synthetic" or "/" not in e.task else r.samples / e.task, "--overwrite", *e.args), (f"export.{m}",))
            for e in r.evals for m in e.models if m in trained_models(r)]


def _ppl(r: Run) -> list[Step]:
    return [Step(f"ppl.{m}", argv("eval", "ppl", "--checkpoint", r.stage_dir("export") / m, "--books", r.samples / r.ppl.books,
                                  "--unigram-shards", r.stage_dir("tokenizer"), "--out", r.stage_dir("ppl") / m,
                                  "--overwrite", *r.ppl.args), (f"export.{m}",))
            for m in r.ppl.models if m in trained_models(r)]


def training_length(r: Run) -> int:
    """Tokens per pretraining line (`data.seq_len` of the pretrain config with the run's sets)."""
    from evalm.train.config import load_run_config

    return load_run_config(r.pretrain.config, _pretrain_sets(r)).data.seq_len


def _recall(r: Run) -> list[Step]:
    """Recall through the cache at multiples of the training length, for EVA and its twins."""
    lengths = ",".join(str(m * training_length(r)) for m in r.recall.multiples)
    return [Step(f"recall.{m}", argv("eval", "recall", "--checkpoint", r.stage_dir("export") / m, "--out",
                                     r.stage_dir("recall") / m, "--tasks", ",".join(r.recall.tasks), "--lengths", lengths,
                                     "--overwrite", *r.recall.args), (f"export.{m}",))
            for m in r.recall.models if m in trained_models(r)]


STAGES: dict[str, Callable[[Run], list[Step]]] = {
    "filter": _data_stage("filter", lambda r: r.samples / "pile", ()),
    "dedup": _data_stage("dedup", lambda r: r.stage_dir("filter"), ("filter",)),
    "blend": _data_stage("blend", lambda r: r.stage_dir("dedup"), ("dedup",)),
    "tokenizer": _tokenizer,
    "pretrain": _pretrain,
    "msit": _msit,
    "twins": _twins,
    "export": _export,
    "icl": _icl,
    "ppl": _ppl,
    "recall": _recall,
}
"""Each stage's steps, stages in run order (the order of `--from`, of the key chain and of `[run] jobs = 1`)."""
RESUMABLE = {"filter", "dedup", "blend", "pretrain", "msit", "twins", "icl", "ppl", "recall"}
"""Stages whose interrupted folder is continued, not wiped. The evaluations resume by unit (finished cells
and books are kept); their `--overwrite` discards units of other settings instead of refusing them."""


def stage_steps(r: Run, stage: str) -> list[Step]:
    return STAGES[stage](r)


def stage_commands(r: Run, stage: str) -> list[list[str]]:
    """A stage's argvs in order (what its key hashes)."""
    return [step.argv for step in stage_steps(r, stage)]
