"""Every command line of the README and the guides runs: taken from the docs, run, and checked covered.

    python -m pytest tests/test_doc_lines.py -q -m "not slow"     (every plan: without -m)

The contract (test_every_documented_line_is_run_by_a_test_or_excused fails naming the file and the
line otherwise): every command line that `tests.doc_lines.command_lines()` finds is
- run by one plan of PLANS here: the plan's patterns select the lines FROM the docs (the text run is
  the docs' text, never a copy kept here), each line runs as a subprocess in a temporary folder on
  real files, after only the edits the plan names (EDITS: pattern, replacement, reason) and on only
  the stand-in inputs it names (INPUTS: files written at the paths the docs name, placeholders such
  as DIR included, each with its reason; built by tests/doc_inputs.py), and must exit 0 without a
  traceback, leaving its --out / --output;
- or run by the test that owns it (OWNERS: the function that test itself reads its lines with);
- or excused (EXCUSED: the line, exactly, and why it cannot run here; a stale excusal fails).
A pattern that selects no line, a line two plans (or a plan and an owner) claim, an edit that changes
none of its plan's lines, and an edit or input no plan uses fail too.

Lines run from the folder the docs assume (a checkout: `configs/`, `train/samples/`,
`data_pipeline/budgets/` and `benchmarks/` are linked in). `evalm`, `python` and `torchrun` are this
interpreter's (`python -m evalm.launcher.cli`, `python -m torch.distributed.run` on a free port).
Plans over ~8 s on 2 cores are marked slow (the suite must stay under 15 minutes on CI's 2 cores); the default run
keeps the quick ones.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import doc_inputs as inputs
from tests.doc_lines import ROOT, command_lines

# ---------------------------------------------------------------------------------------------------------
# EDITS: what changes between a documented line and the line run here. Nothing else is changed.
SMALL = "a test-sized run of the same command"
EDITS: dict[str, tuple[str, str, str]] = {
    # name: (pattern, replacement, reason)
    "abs-paths": (r" /(data|shared)/", r" {work}/\1/", "absolute paths of the user's machine -> the same paths under the work folder"),
    "redis": (r"redis://(HOST|127\.0\.0\.1):6379/0", "{redis}", "the user's Redis -> the real Redis the tests start"),
    "ranks": (r"--nproc_per_node=8", "--nproc_per_node=2", "8 GPUs -> 2 CPU ranks (gloo)"),
    "cpu": (r"--(eval|ppl|recall)\.device=cuda", r"--\1.device=cpu", "no GPU in CI: the same ranks on the CPU"),
    "slurm": (r"^srun .*? torchrun --nnodes=4 --nproc_per_node=8\s+--rdzv_backend=c10d --rdzv_endpoint=\$MASTER:29500 "
              r"--rdzv_id=\$SLURM_JOB_ID",
              "torchrun --nnodes=1 --nproc_per_node=2 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:{port} --rdzv_id=1",
              "no Slurm here: one node's torchrun with the same c10d rendezvous, on this machine"),
    "tasks": (r"--tasks \d+", "--tasks 2", "30 or 64 tasks -> 2 (one file each)"),
    "workers": (r"--workers 8", "--workers 2", "8 worker processes -> 2 cores"),
    "table5": (r"--budgets data_pipeline/budgets/table5\.toml", "--budgets configs/budgets-tiny.toml",
               "Table 5's absolute budgets (120B tokens) would upsample a CI-sized corpus: its proportions instead"),
    "shots": (r"--shots [\d,]+", "--shots 0,4", SMALL),
    "seeds": (r"--seeds [\d,]+", "--seeds 1", SMALL),
    "budgets": (r"--budgets [\d,]+", "--budgets 0,256", SMALL),
    "items": (r"--test-items \d+", "--test-items 4", SMALL),
    "few-items": (r"^((?:evalm eval icl|.*-m evalm\.icl_eval icl)(?!.*--test-items).*)$", r"\1 --test-items 4", SMALL),
    "lengths": (r"--lengths \S+", "--lengths 64,128 --max-tokens 128 --ppl.segment_tokens=32 --ppl.max_books=1",
                "PG-19's lengths to 256k -> 128 tokens (tests/icl_eval/test_ppl_readme.py runs 262,144)"),
    "ppl-small": (r"^((?!.*--lengths).*)$", r"\1 --lengths 64,128 --max-tokens 128 --ppl.segment_tokens=32 --ppl.max_books=1", SMALL),
    "steps": (r"^((?:evalm train (?:pretrain|msit)|.*-m evalm\.train\.(?:pretrain|msit)) .*)$",
              r"\1 --set train.steps=2 --set checkpoint.save_every=2 --set data.seq_len=64", SMALL),
    "steps-200": (r"--set train\.steps=200", "--set train.steps=2", SMALL),
    "episodes": (r"--episodes 1000 --examples 120", "--episodes 10 --examples 20", SMALL),
    "msit-data": (r"$", " --episodes 10 --examples 20", SMALL),
    "metaicl": (r"^(evalm train metaicl.*)$", r"\1 --set metaicl.steps=2 --set metaicl.batch_size=2 --set metaicl.train_k=4", SMALL),
    "harness": (r"--num-fewshot 16 --seeds 1,2,3 --limit 200", "--num-fewshot 2 --seeds 1 --limit 4", SMALL),
    "optional": (r"\[([^][]*)\]", r"\1", "a synopsis: its optional parts `[...]` are run included (innermost first)"),
    "optional-outer": (r"\[([^][]*)\]", r"\1", "the same, for the outer of two nested optional parts"),
    "first-of": (r"\|[^ \]]+", "", "a synopsis's alternatives `a|b`: the first is run"),
    "ellipsis": (r"evalm eval icl \.\.\.", "evalm eval icl --hf-model models/my-lm --task banking77 --label-map int "
                 "--seeds 1 --test-items 4",
                 "`...` stands for the arguments of the line above it"),
    "common": (r"\$COMMON", "--hf-model models/my-lm --methods incremental --eval.method.scoring=answer-sum "
               "--eval.method.on_overflow=drop_left --eval.dtype=bfloat16 --seeds 1,2,3 --test-items 200",
               "$COMMON as scripts/smollm_remap.sh sets it, with a tiny model for the SmolLM2 GGUF"),
    "loop": (r"\$s\b", "1", "the shell loop's variable: its first value"),
    "saicl-repro": (r"^(evalm run --config configs/study-saicl\.toml)$",
                    r"\1 --root runs/saicl-repro " + " ".join(f"--set study.vars.{k}={v}" for k, v in (
                        ("shots", 4), ("mid", 4), ("top", 4), ("seeds", 1), ("items", 4), ("steps", 2), ("batch", 2))),
                    SMALL),
    "saicl-t5": (r"--shots 4 16 64 128 256", "--shots 4 16 --repeats 1", SMALL),
    "recall-small": (r"^((?:evalm eval recall|.*-m evalm\.icl_eval recall) .*)$",
                     r"\1 --lengths 1200 --depths 0,100 --seeds 1 --items 1 --recall.mqar_pairs=4", SMALL),
    "gguf": (r" --gguf-file \S+", "", "SmolLM2's GGUF (the `smollm` extra) -> the tiny GPT-2 folder's own weights"),
    "recall-study-train": (r"^(evalm train recall .*)$", r"\1 --steps 4", SMALL),
    "recall-study-cells": (r"^(evalm eval recall-cells .*)$", r"\1 --items 2 --long-items 1 --lengths 64,256 --test-kv 4",
                           SMALL),
}


# ---------------------------------------------------------------------------------------------------------
# INPUTS: what a documented line reads that only the user has, written here at the path the docs name
# (placeholders such as DIR included), CI-sized. Each: (builder, reason).
INPUTS = {
    "models/my-lm": (inputs.hf_lm("models/my-lm"), "your Hugging Face model: a tiny random GPT-2 with a BPE tokenizer"),
    "DIR=model": (inputs.hf_lm("DIR"), "the placeholder of your model folder: the same tiny GPT-2"),
    "models/opt-350m": (inputs.hf_lm("models/opt-350m", "opt"), "OPT-350M: a tiny random OPT of the same class"),
    "T5DIR": (inputs.t5, "the placeholder of a T5 folder: a tiny random T5 with a BPE tokenizer"),
    "DATA": (inputs.sst2_folder, "the placeholder of an sst2 folder: train/test jsonl with `sentence`, `label`"),
    "my_task": (inputs.task("my_task"), "your task: a two-label task file with its split files"),
    "data/agnews": (inputs.agnews, "AG News's split files: 4-label rows"),
    "sst2": (inputs.sst2_cache, "GLUE sst2 in the offline datasets cache (hub layout)"),
    "banking77": (inputs.banking77_cache, "PolyAI/banking77 in the offline datasets cache, ClassLabel names"),
    "deepmind/pg19": (inputs.pg19_cache, "PG-19's test books in the offline datasets cache"),
    "pg19/test": (inputs.pg19_folder, "PG-19's split folder of .txt books: two books"),
    "runs/export": (inputs.exported("runs/export"), "an exported EVALM: a one-layer byte-level model"),
    "export/evalm": (inputs.exported("export/evalm"), "an exported EVALM: a one-layer byte-level model"),
    "pile": (inputs.pile, "the Pile's shards (/data/pile/train/NN.jsonl.zst, /data/corpus): seeded Pile-format text"),
    "data.toml": (inputs.data_toml, "the data config: the guide's own block of defaults"),
    "data/samples": (inputs.samples, "`evalm data samples`' folder in its layout (seeded), with a rotten_tomatoes task"),
    "tasks/my_task.yaml": (inputs.harness_task, "your lm-eval task: a local two-choice task"),
    "tokenizer.json": (inputs.tokenizer_json, "your tokenizer.json: a BPE trained here"),
    "DOCS": (inputs.docs, "the placeholder of your documents: a folder holding the shipped sample documents"),
    "runs/tiny/tokenizer": (inputs.main_job_tokens, "what `evalm run` leaves: its tokenizer stage's shards, by the stage's command"),
    "runs/tiny/export/msit": (inputs.main_job_export, "what `evalm run` leaves: its exported tuned model (a one-layer stand-in)"),
    "data/samples/tasks/subj": (inputs.task("data/samples/tasks/subj"), "the samples' subj task: a two-label task file"),
    "DIR=cache": (inputs.samples_cache, "the placeholder of the download cache: the user's (else empty: pip downloads)"),
}


# ---------------------------------------------------------------------------------------------------------
# PLANS: which documented lines run together (in document order, in one work folder), on which inputs,
# after which edits. `runs` are patterns matched at the start of a line; `first` are lines another plan
# covers, run before to make this plan's inputs (the documented way to make them).
@dataclass(frozen=True)
class Plan:
    name: str
    runs: tuple[str, ...]
    inputs: tuple[str, ...] = ()
    edits: tuple[str, ...] = ()
    first: tuple[str, ...] = ()
    slow: bool = False
    alternatives: bool = False
    """The lines are alternatives writing the same output folder: each runs without the previous one's."""


TOKENS = r"evalm train tokenizer --input train/samples/documents\.jsonl"
PLANS = [
    Plan("set-up", (r"python3 -m venv \.venv$",)),
    Plan("your-model-your-task", (r"evalm eval icl --hf-model models/my-lm --task my_task/task\.toml",),
         ("models/my-lm", "my_task"), ("shots", "seeds")),
    Plan("your-model-banking77", (r"evalm eval icl --hf-model models/my-lm --task banking77",),
         ("models/my-lm", "banking77"), ("budgets", "few-items"), slow=True),
    Plan("your-model-on-n-ranks", (r"torchrun --nproc_per_node=8 -m evalm\.icl_eval icl --hf-model models/my-lm",),
         ("models/my-lm", "banking77"), ("ranks", "shots", "few-items"), slow=True),
    Plan("your-corpus", (r"evalm data (filter|dedup|blend) +--input (/data/corpus|out/(filter|dedup)) --output out/\w+ --(tasks 8|budgets)",),
         ("pile",), ("abs-paths", "redis", "table5"), slow=True),
    Plan("data-stages-synopsis", (r"evalm data (filter|dedup|blend) +--input \S+( /data/\S+)? +--output out/\w+ --tasks (30|64)\b",),
         ("pile", "data.toml"), ("abs-paths", "tasks", "workers", "optional", "optional-outer", "redis", "table5"), slow=True),
    Plan("training-quick-start", (TOKENS, r"evalm train pretrain --config configs/pretrain-tiny\.toml --out runs/pretrain-tiny$",
                                  r"evalm train msit --config configs/msit-tiny\.toml", r"evalm export --checkpoint runs/msit-tiny"),
         edits=("steps",), slow=True),
    Plan("export-hf", (r"evalm export --hf --checkpoint runs/tiny/export/msit --out models/evalm-hf",), ("runs/tiny/export/msit",),
         slow=True),
    Plan("resume-a-run", (r"evalm train pretrain --config configs/pretrain-tiny\.toml --set data\.shards=runs/tiny/tokenizer",),
         ("runs/tiny/tokenizer",), ("steps",), slow=True),
    Plan("main-job-export-on-a-shipped-task", (r"evalm eval icl --checkpoint runs/tiny/export/msit",),
         ("runs/tiny/export/msit", "data/samples/tasks/subj"), ("shots", "seeds", "items"), slow=True),
    Plan("pretrain-entry-points", (r"python -m evalm\.train\.pretrain", r"torchrun --nproc_per_node=2 -m evalm\.train\.pretrain",
                                   r"evalm train pretrain --config configs/pretrain-tiny\.toml --set model\.attention"),
         edits=("steps", "steps-200"), first=(TOKENS,), alternatives=True, slow=True),
    Plan("tokenizer-synopsis", (r"evalm train tokenizer --input DOCS",), ("DOCS", "tokenizer.json"), ("optional",),
         alternatives=True),
    Plan("msit-data", (r"evalm train msit-data",), ("data/samples",), ("episodes", "msit-data")),
    Plan("built-in-icl", (r"evalm eval icl$", r"evalm eval icl --config configs/eval-tiny\.toml"), (), ("few-items",),
         slow=True, alternatives=True),
    Plan("built-in-ppl", (r"evalm eval ppl --books train/samples",), slow=True),
    Plan("exported-on-sst2", (r"evalm eval icl --checkpoint runs/export --task sst2", r"python -m evalm\.icl_eval icl --checkpoint export/evalm",
                              r"torchrun --nproc_per_node=8 -m evalm\.icl_eval icl --checkpoint", r"srun "),
         ("runs/export", "export/evalm", "sst2"), ("slurm", "shots", "seeds", "few-items", "ranks", "cpu", "abs-paths"),
         alternatives=True, slow=True),
    Plan("opt-on-agnews", (r"evalm eval icl --hf-model models/opt-350m",), ("models/opt-350m", "data/agnews"),
         ("few-items",), slow=True),
    Plan("perplexity", (r"evalm eval ppl --checkpoint runs/export", r"torchrun --nproc_per_node=8 -m evalm\.icl_eval ppl"),
         ("runs/export", "export/evalm", "deepmind/pg19", "pg19/test"), ("lengths", "ppl-small", "ranks", "cpu"),
         alternatives=True, slow=True),
    Plan("budgets-and-diagnostics", (r"evalm eval icl --hf-model DIR", r"evalm eval icl \.\.\."),
         ("DIR=model", "models/my-lm", "banking77"), ("budgets", "seeds", "items", "ellipsis"), slow=True),
    Plan("harness", (r"evalm eval harness",), ("runs/export", "tasks/my_task.yaml"), ("harness", "optional", "first-of"), slow=True),
    Plan("t5", (r"evalm eval icl --hf-model T5DIR",), ("T5DIR", "DATA"), ("shots", "few-items"), slow=True),
    Plan("metaicl", (r"evalm train metaicl", r"evalm eval icl --hf-model runs/metaicl/saicl"), (),
         ("metaicl", "shots", "few-items"), slow=True),
    Plan("saicl-benchmarks", (r"evalm run --config configs/study-saicl\.toml", r"python benchmarks/saicl_t5\.py"), (),
         ("saicl-repro", "saicl-t5"), slow=True),
    Plan("smollm-remap-commands", (r"evalm eval icl \$COMMON",), ("models/my-lm", "data/samples"),
         ("common", "loop", "items", "budgets", "seeds", "shots"), slow=True),
    Plan("samples", (r"evalm data samples",), ("DIR=cache",), ("optional",), slow=True,
         alternatives=True),
    Plan("recall", (r"evalm eval recall --checkpoint runs/export", r"torchrun --nproc_per_node=8 -m evalm\.icl_eval recall"),
         ("runs/export", "export/evalm", "pg19/test"), ("recall-small", "ranks", "cpu"), alternatives=True, slow=True),
    Plan("recall-smollm", (r"evalm eval recall --hf-model DIR",), ("DIR=model",), ("gguf", "recall-small"), slow=True),
    Plan("recall-study", (r"evalm train recall", r"evalm eval recall-cells", r"evalm eval recall-tables"), (),
         ("recall-study-train", "recall-study-cells"), slow=True),
]


def _ci_lines() -> list[str]:
    """The README's test command, which .ci/run runs as written (a test cannot run the suite it is in)."""
    return [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
            if line.strip() == 'python -m pytest -m "not slow" -n 2 --dist loadfile']


def _owners() -> dict[str, list[str]]:
    """OWNERS: the lines another test runs, each read by the function that test itself reads them with."""
    from tests.launcher.test_run import readme_main_job
    from tests.test_paper_chain import readme_block
    from tests.train.test_convert_uptrain import documented_lines

    return {"tests/test_paper_chain.py (slow)": readme_block(), "tests/launcher/test_run.py": [readme_main_job()],
            ".ci/run (CI runs it as written)": _ci_lines(), "tests/train/test_convert_uptrain.py": documented_lines()}


EXCUSED = {  # line: why it cannot run here
}


# ---------------------------------------------------------------------------------------------------------
def selected(pattern: str, lines: list[tuple[str, str]]) -> list[str]:
    """The distinct documented lines a pattern selects, in document order."""
    return list(dict.fromkeys(line for _, line in lines if re.match(pattern, line)))


def uncovered(lines: list[tuple[str, str]], plans: list[Plan], owners: dict[str, list[str]],
              excused: dict[str, str]) -> list[str]:
    """Every way the contract is broken, one line each: a line nothing runs (file and line), a line two
    plans claim, a pattern that selects nothing, an edit or input no table has, a stale excusal."""
    problems, claims = [], {}
    for plan in plans:
        for pattern in plan.runs:
            chosen = selected(pattern, lines)
            problems += [f"plan {plan.name}: {pattern!r} selects no documented line"] if not chosen else []
            for line in chosen:
                if line in claims and claims[line] != plan.name:
                    problems.append(f"{line!r} is claimed by plans {claims[line]} and {plan.name}")
                claims[line] = plan.name
        problems += [f"plan {plan.name}: {p!r} selects no documented line" for p in plan.first if not selected(p, lines)]
        problems += [f"plan {plan.name}: no edit {e}" for e in plan.edits if e not in EDITS]
        problems += [f"plan {plan.name}: no input {i}" for i in plan.inputs if i not in INPUTS]
    owned = {line for owned_lines in owners.values() for line in owned_lines}
    texts = {line for _, line in lines}
    problems += [f"excused line is not in the docs (stale): {line!r}" for line in excused if line not in texts]
    problems += [f"{line!r} is claimed by plan {claims[line]} and owned by another test" for line in claims if line in owned]
    problems += [f"{where}: `{line}` is run by no test" for where, line in lines
                 if line not in claims and line not in owned and line not in excused]
    return problems


def test_every_documented_line_is_run_by_a_test_or_excused():
    assert uncovered(command_lines(), PLANS, _owners(), EXCUSED) == []
    assert len(EXCUSED) <= 2  # only what truly cannot run here


def test_the_coverage_check_names_an_uncovered_line_and_a_stale_excusal():
    lines = [*command_lines(), ("guide.md", "evalm eval icl --shots 1 --new-flag")]
    assert uncovered(lines, PLANS, _owners(), {**EXCUSED, "evalm gone": "stale"}) == [
        "excused line is not in the docs (stale): 'evalm gone'",
        "guide.md: `evalm eval icl --shots 1 --new-flag` is run by no test"]
    assert uncovered(command_lines(), [*PLANS, Plan("x", ("evalm nothing",))], _owners(), EXCUSED) == [
        "plan x: 'evalm nothing' selects no documented line"]


def test_every_edit_and_input_is_used_by_a_plan():
    assert {e for p in PLANS for e in p.edits} == set(EDITS)
    assert {i for p in PLANS for i in p.inputs} == set(INPUTS)


def edited(line: str, edits: tuple[str, ...], used: set[str]) -> str:
    for name in edits:
        pattern, replacement, _ = EDITS[name]
        new = re.sub(pattern, replacement, line)
        used.update([name] if new != line else [])
        line = new
    return line


def to_argv(line: str) -> list[str]:
    from tests.train.helpers import free_port

    argv = shlex.split(line)
    if argv[0] == "evalm":
        return [sys.executable, "-m", "evalm.launcher.cli", *argv[1:]]
    if argv[0] in ("python", "python3"):
        return [sys.executable, *argv[1:]]
    assert argv[0] == "torchrun", line
    port = [] if any(a.startswith("--rdzv_endpoint") for a in argv) else [f"--master_port={free_port()}"]
    return [sys.executable, "-m", "torch.distributed.run", *port, *argv[1:]]


def output_of(argv: list[str]) -> str | None:
    """The folder (or file) a line writes: its --out / --output, or the environment `-m venv` makes."""
    if argv[1:3] == ["-m", "venv"]:
        return argv[3]
    for flag in ("--out", "--output"):
        if flag in argv:
            return argv[argv.index(flag) + 1]
    return None


def run_plan(plan: Plan, work: Path, redis: str | None) -> list[str]:
    """Run the plan's lines (its `first` lines, then its own) in `work`; the lines as run."""
    from tests.train.helpers import free_port

    lines = command_lines()
    work.mkdir()
    inputs.link_checkout(work)
    for name in plan.inputs:
        INPUTS[name][0](work)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    used, ran = set(), []
    todo = [(line, ()) for p in plan.first for line in selected(p, lines)]
    todo += [(line, plan.edits) for p in plan.runs for line in selected(p, lines)]
    for documented, edits in todo:
        line = edited(documented, edits, used)
        line = line.replace("{work}", str(work)).replace("{redis}", redis or "").replace("{port}", str(free_port()))
        argv = to_argv(line)
        if plan.alternatives and edits:  # each alternative starts from the inputs and the `first` lines' outputs
            if not (work.parent / "base").exists():
                shutil.copytree(work, work.parent / "base", symlinks=True)
            shutil.rmtree(work)
            shutil.copytree(work.parent / "base", work, symlinks=True)
        start = time.perf_counter()
        done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        print(f"{time.perf_counter() - start:6.1f} s  {line}")
        assert done.returncode == 0 and "Traceback" not in done.stderr, \
            f"{documented}\nran as: {line}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        out = output_of(argv)
        assert out is None or any((work / out).iterdir() if (work / out).is_dir() else [(work / out).is_file()]), \
            f"{documented}: nothing at {out}"
        ran.append(line)
    assert set(plan.edits) <= used, f"plan {plan.name}: edits that change none of its lines: {set(plan.edits) - used}"
    return ran


@pytest.mark.parametrize("plan", [pytest.param(p, id=p.name, marks=[pytest.mark.slow] if p.slow else []) for p in PLANS])
def test_documented_lines_run(plan, tmp_path, request):
    redis = request.getfixturevalue("redis_url") if "redis" in plan.edits else None
    run_plan(plan, tmp_path / "work", redis)
