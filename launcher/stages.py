"""The stage table of `evalm run`: each stage's commands, built from the command table `evalm` dispatches.

Stages exchange files, never objects: each one is the same command a user runs as a separate job
(`evalm data filter`, `evalm train msit-data`, `evalm train pretrain`, ...), written here with
`launcher.commands.argv` with the run's folders wired in and the run file's extra arguments
appended. `twins` trains the baselines EVALM compares EVA with on the same data, steps and seed
(full attention; learned absolute positions), `export` writes every model to export/NAME/, and
`icl` / `ppl` evaluate the models each entry names (one process, resumable by unit: `icl_eval.protocol.units`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from evalm.launcher.commands import argv
from evalm.launcher.run_file import MODELS, Run, trained_models

SYNTHETIC_SEED = 10**6
"""Seed of the tuning data's synthetic rules, far from the evaluation episodes' small seeds."""


def _data_stage(name: str, source: Callable[[Run], Path]) -> Callable[[Run], list]:
    def command(r: Run) -> list:
        return argv("data", name, "--input", source(r), "--output", r.stage_dir(name),
                    "--tasks", r.run.data_tasks, "--workers", r.run.workers, *getattr(r.data, name))

    return command


def _tokenizer(r: Run) -> list:
    return argv("train", "tokenizer", "--input", r.stage_dir("blend"), "--output", r.stage_dir("tokenizer"),
                "--vocab-size", r.tokenizer.vocab_size, *r.tokenizer.args)


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


def _pretrain(r: Run) -> list:
    return _train_command("pretrain", r.pretrain.config, r.stage_dir("pretrain"), _pretrain_sets(r))


def _msit_data(r: Run) -> list:
    """`evalm train msit-data`: the synthetic episodes of [msit], then the samples' instruction rows."""
    m = r.msit
    args = ["--out", msit_data_file(r), "--episodes", m.synthetic_episodes, "--examples", m.synthetic_examples,
            "--inputs", ",".join(map(str, m.synthetic_inputs)), "--seed", SYNTHETIC_SEED]
    source = r.samples / "instructions" / "train.jsonl"
    if m.sample_instructions and source.is_file():
        args += ["--instructions", source, "--instructions-limit", m.sample_instructions]
    return argv("train", "msit-data", *args)


def _msit(r: Run) -> list:
    return [_msit_data(r), _train_command("msit", r.msit.config, r.stage_dir("msit"),
                                          _msit_sets(r, r.stage_dir("pretrain")))]


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


def _export(r: Run) -> list:
    return [argv("export", "--checkpoint", r.dir.joinpath(*MODELS[m]), "--out", r.stage_dir("export") / m)
            for m in trained_models(r)]


def _icl(r: Run) -> list:
    return [argv("eval", "icl", "--checkpoint", r.stage_dir("export") / m, "--out", r.stage_dir("icl") / e.name / m,
                 "--task", e.task if e.task == "synthetic" or "/" not in e.task else r.samples / e.task, "--overwrite",
                 *e.args)
            for e in r.evals for m in e.models if m in trained_models(r)]


def _ppl(r: Run) -> list:
    return [argv("eval", "ppl", "--checkpoint", r.stage_dir("export") / m, "--books", r.samples / r.ppl.books,
                 "--unigram-shards", r.stage_dir("tokenizer"), "--out", r.stage_dir("ppl") / m, "--overwrite", *r.ppl.args)
            for m in r.ppl.models if m in trained_models(r)]


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
"""Each stage's command (one argv) or commands (a list of argvs), in run order."""
RESUMABLE = {"filter", "dedup", "blend", "pretrain", "msit", "twins", "icl", "ppl"}
"""Stages whose interrupted folder is continued, not wiped. The evaluations resume by unit (finished cells
and books are kept); their `--overwrite` discards units of other settings instead of refusing them."""


def stage_commands(r: Run, stage: str) -> list[list[str]]:
    """A stage's argvs, always as a list of them."""
    commands = STAGES[stage](r)
    return commands if commands and isinstance(commands[0], list) else [commands]
