"""`evalm eval`: many-shot ICL (`icl`), perplexity vs length (`ppl`), lm-eval tasks (`harness`), recall (`recall`).

    evalm eval icl                                   # the built-in default: trains a tiny EVALM on the synthetic family, evaluates it
    evalm eval icl --checkpoint DIR --task sst2 --methods incremental,concat,structured \\
                   --shots 1,16,128 --seeds 1,2,3 --out runs/icl [--save-predictions] [--eval.calibration=pmi]
    evalm eval icl --hf-model DIR ...                # a local Hugging Face causal LM (OPT/GPT-2/SmolLM2)
    evalm eval ppl --checkpoint DIR --books PG19/test --lengths 1024,8192,65536,262144 --out runs/ppl

Settings are the built-in defaults, then a config file only when `--config` names one (sections
`[eval]`, `[eval.method]`, `[ppl]`, `[model]`, `[synthetic]`), then flags and `--section.key=value`
overrides, which win. Each command prints the effective settings in one block before it starts and
writes them to results.json (`settings`). What the data cannot supply (more shots than training
items, more test items than the split, a length no book reaches) is an error, or with --allow-skip
a skip recorded in results.json; never a silent cap.

Each command turns its flags into typed values once, at its edge: its sections' configs and one
`Invocation` (`cli_args.invocation`: the `ModelSource`, the `LoadOptions`, --out and the switches);
`icl`, `ppl` and `recall` then run through one skeleton (`protocol/skeleton.py`), and no function
past the edge sees the parsed flags (tests/icl_eval/test_cli_edge.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from evalm.config_toolkit import ConfigError, Dispatcher, Parser, build, lazy, to_dict
from evalm.storage import RunFolder
from evalm.icl_eval.cli_args import (ICL_SECTIONS, PPL_SECTIONS, CommandForm, common, csv, icl_parser, invocation,
                                     is_tiny, load_flags, parse_command, ppl_parser)
from evalm.icl_eval.models.source import LoadOptions, ModelSource
from evalm.icl_eval.protocol.skeleton import Grid, Invocation, evaluate, open_store
from evalm.icl_eval.protocol.units import icl_inputs, icl_key, ppl_inputs, ppl_key
from evalm.icl_eval.settings import built_in_sections


ICL_FLAGS = {"task": "task", "data": "data", "methods": "methods", "shots": "shots", "seeds": "seeds",
             "test_items": "test_items", "bos": "bos", "save_predictions": "save_predictions", "budgets": "budgets",
             "label_map": "label_map", "order": "order", "order_seeds": "order_seeds", "nearest": "nearest",
             "nearest_k": "nearest_k", "nearest_embedding": "nearest_embedding"}
"""`evalm eval icl` flag attribute -> `[eval]` key (the load flags are added by `cli_args.load_keys`)."""


@dataclasses.dataclass(frozen=True)
class IclJob:
    """What `evalm eval icl` scores besides the model: the protocol, the method knobs, the task and its data."""

    config: Any
    """`[eval]` (EvalConfig), after the supply checks."""
    options: Any
    """`[eval.method]` (MethodOptions)."""
    task: Any
    splits_for_seed: Callable[[int], dict]
    data_info: dict
    skipped: list


def icl(argv: Sequence[str]) -> int:
    from evalm.icl_eval.config import EvalConfig
    from evalm.icl_eval.methods.decoder import MethodOptions
    from evalm.icl_eval.settings import record
    from evalm.icl_eval.protocol.supply import icl_supply
    from evalm.icl_eval.tasks.data import resolve_task

    args, layers, where, config = parse_command(argv, CommandForm(icl_parser, ICL_SECTIONS, "eval", EvalConfig,
                                                                  ICL_FLAGS))
    if args.budgets and args.shots:
        raise ConfigError("--budgets and --shots: the grid is by token budget or by shot count; give one of them")
    options = build(MethodOptions, layers.section("eval.method"), where=f"{where} [eval.method]")
    model_cfg, syn = built_in_sections(layers, is_tiny(args), where, need_synthetic=config.task == "synthetic")
    task, splits_for_seed, data_info = resolve_task(config, syn, tiny_model=model_cfg is not None)
    config, skipped = icl_supply(config, splits_for_seed(config.seeds[0]), args.allow_skip)
    settings = record(layers, {"eval": config, "eval.method": options, "model": model_cfg, "synthetic": syn},
                      {"skipped": skipped} if skipped else None)
    run = invocation(args, "evalm eval icl", config, settings, model_cfg, syn)
    job = IclJob(config, options, task, splits_for_seed, data_info, skipped)
    inputs = icl_inputs(run.source, args.task, data_info)
    return evaluate(run, inputs, lambda folder, world: _icl(run, job, inputs, folder, world))


def _icl(run: Invocation, job: IclJob, inputs: list, folder, world) -> None:
    """The skeleton's body for `evalm eval icl`: the settings block, the model, its checks, the units, the report."""
    from evalm.icl_eval.models.loading import describe, load_lm
    from evalm.icl_eval.protocol.runner import Runner

    store = open_store(run, folder, world, lambda: icl_key(run.source, folder, run.settings, job.task, job.data_info),
                       inputs)
    config, options = job.config, job.options
    lm = load_lm(run.source, run.options, world.device(run.options.device))
    runner = Runner(lm, job.task, config, options, job.splits_for_seed)
    runner.check_budgets()  # a budget below one demonstration is refused before any scoring
    label_tokens = runner.prompt_for(config.seeds[0]).label_token_counts()
    if world.rank == 0 and len(set(label_tokens.values())) > 1 and options.scoring.endswith("-sum"):
        print(f"warning: the labels tokenize to unequal lengths {label_tokens}: {options.scoring} scores favour the "
              "shorter ones; consider --eval.method.scoring=answer-mean or another verbalizer", file=sys.stderr)
    store.prepare()  # after every check of the input, before any scoring: units of other settings are refused
    units = runner.units()
    grid = Grid(store, [f"{i:05d}-seed{seed}-{split}-{value}" for i, (seed, split, value) in enumerate(units)],
                run.command)
    runner.progress = grid.progress.tick
    t0 = time.perf_counter()
    loaded = grid.run(lambda i: (runner.run_unit(units[i]), None))
    if loaded is None:  # not rank 0: rank 0 merges every unit
        return
    runner.adopt([meta for meta, _ in loaded])  # the one-process order: unit after unit
    results = runner.results(describe(lm), job.data_info, time.perf_counter() - t0)
    results["execution"] = grid.execution()
    results["settings"], results["skipped"] = run.settings, job.skipped
    _write_icl(run.out, {**results, "_predictions": runner.predictions, "_name": lm.name}, config)


def _write_icl(out: Path, results: dict, config) -> None:
    from evalm.icl_eval.report import plot_accuracy, plot_time, write_json, write_predictions

    predictions, name = results.pop("_predictions"), results.pop("_name")
    summary, protocol = results["summary"], results["protocol"]
    write_json(out / "results.json", results)
    write_json(out / "config.json", {"eval": protocol["eval"], "eval.method": protocol["method_options"]})
    if config.save_predictions:
        write_predictions(out / "predictions.jsonl", predictions)
    title = f"{protocol['task']} - {Path(name).name or name}"
    plot_accuracy({"": summary}, out / "accuracy_vs_shots.png", title)
    plot_time(summary, out / "time_per_item_vs_shots.png", title)
    _print_summary(summary)
    print(f"wrote {out}/results.json and plots")


def _print_summary(summary: dict) -> None:
    """One line per method: accuracy [95% interval] per shot, then the best baseline per shot."""
    from evalm.icl_eval.stats.summary import finetune_lines

    def ci(c):
        return f"[{c[0]:.2f}, {c[1]:.2f}]"

    for method, shots in summary["test"].items():
        ordered = sorted(shots.items(), key=lambda kv: int(kv[0]))
        cells = "  ".join(f"{k}:{v['accuracy_mean']:.3f} {ci(v['accuracy_ci95'])}" for k, v in ordered)
        print(f"{method:>12}  {cells}")
    ordered = sorted(next(iter(summary["test"].values())).items(), key=lambda kv: int(kv[0]))
    cells = "  ".join(f"{k}:{v['baselines'][v['gain']['over']]['mean']:.3f} ({v['gain']['over']})" for k, v in ordered)
    print(f"{'best label baseline':>12}  {cells}")
    for line in finetune_lines(summary):  # --methods finetune: beside the first ICL method (docs/evaluation.md)
        print(line)
    for method, best in summary.get("best_shot", {}).items():
        print(f"{method:>12}  best shot on validation {best['best_shot']}: test {best['test_accuracy']:.3f}")


PPL_FLAGS = {"books": "books", "lengths": "buckets", "max_tokens": "max_tokens", "unigram_shards": "unigram_shards",
             "fixed_contexts": "fixed_contexts", "by_offset": "offset_block"}
"""`evalm eval ppl` flag attribute -> `[ppl]` key (the load flags are added by `cli_args.load_keys`)."""


def ppl(argv: Sequence[str]) -> int:
    from evalm.icl_eval.config import PerplexityConfig
    from evalm.icl_eval.settings import record
    from evalm.icl_eval.protocol.supply import ppl_lengths

    args, layers, where, config = parse_command(argv, CommandForm(ppl_parser, PPL_SECTIONS, "ppl", PerplexityConfig,
                                                                  PPL_FLAGS))
    flag = "--max-tokens" if layers.sources.get("ppl.max_tokens") == "--max-tokens" else "ppl.max_tokens"
    config = dataclasses.replace(config, max_tokens=ppl_lengths(config.buckets, config.max_tokens, flag))
    if not config.books:
        raise ConfigError("--books: give a PG-19 split folder of .txt books, .txt files, a jsonl file with `text` "
                          "(e.g. train/samples/documents.jsonl), or deepmind/pg19:test from the datasets cache")
    model_cfg, syn = built_in_sections(layers, is_tiny(args), where, need_synthetic=False)
    settings = record(layers, {"ppl": config, "model": model_cfg, "synthetic": syn})
    run = invocation(args, "evalm eval ppl", config, settings, model_cfg, syn)
    inputs = ppl_inputs(run.source, config)
    return evaluate(run, inputs, lambda folder, world: _ppl(run, config, inputs, folder, world))


def _ppl(run: Invocation, config, inputs: list, folder, world) -> None:
    """The skeleton's body for `evalm eval ppl`: the settings block, the model, the books' reach, the units, the report."""
    from evalm.icl_eval.perplexity.books import iter_books
    from evalm.icl_eval.models import loading
    from evalm.icl_eval.protocol.supply import ppl_reach

    store = open_store(run, folder, world, lambda: ppl_key(run.source, folder, run.settings, config), inputs)
    lm = loading.load_lm(run.source, run.options, world.device(run.options.device))
    fixed_need = max(config.fixed_contexts) + config.fixed_target_tokens if config.fixed_contexts else 0
    skipped = ppl_reach(iter_books(config.books, config.max_books), lm.tokenizer.encode, config.buckets,
                        fixed_need, run.allow_skip)
    if skipped:
        run.settings["skipped"] = skipped
        if world.rank == 0:
            print(f"skipped (--allow-skip): {skipped[0]['why']}", file=sys.stderr)
    store.prepare()  # after every check of the input, before any scoring: units of other settings are refused
    results = _run_ppl(lm, config, store)
    if results is not None:  # rank 0 merged every book
        results["settings"], results["skipped"] = run.settings, skipped
        _write_ppl(run.out, results, lm)


def _run_ppl(lm, config, store) -> dict | None:
    """This rank's books (one unit each); on rank 0 then every book's scores reported in book order."""
    from evalm.icl_eval.perplexity.books import iter_books
    from evalm.icl_eval.models.loading import describe
    from evalm.icl_eval.perplexity.lengths import Protocols
    from evalm.icl_eval.perplexity.unigram import fit_unigram

    t0 = time.perf_counter()
    unigram = fit_unigram(config.unigram_shards, lm.tokenizer.vocab_size) if config.unigram_shards else None
    protocols = Protocols(lm, config, unigram)
    world = store.world
    say = (lambda line: print(line, file=sys.stderr)) if world.rank == 0 else None  # a book named twice
    names = [f"{i:05d}-book" for i, _ in enumerate(iter_books(config.books, config.max_books, say))]
    # progress in tokens, time left from them: one book to 131,072 tokens is an hour on a CPU
    grid = Grid(store, names, "evalm eval ppl", unit="tokens", per_unit=protocols.max_tokens)
    protocols.tick = grid.progress.tick
    books = iter_books(config.books, config.max_books)  # lazily: one book in memory at a time
    mine = ((i, book) for i, book in enumerate(books) if i % world.size == world.rank)

    def compute(i: int) -> tuple[dict, dict]:
        j, (name, text) = next(mine)
        while j != i:  # a unit finished before: its book is skipped
            j, (name, text) = next(mine)
        return _book_unit(protocols.score(name, text))

    loaded = grid.run(compute)
    if loaded is None:
        return None
    results = protocols.report([_book_scores(*unit) for unit in loaded])
    results["model"] = describe(lm)
    results["config"] = to_dict(config)
    results["seconds"] = time.perf_counter() - t0
    results["execution"] = grid.execution()
    return results


def _book_unit(scored: dict) -> tuple[dict, dict]:
    """A book's scores as a unit file: the row and span NLLs as JSON (exact for floats), the rest as arrays."""
    arrays = {f"nll.{name}": v for name, v in scored["nll"].items()}
    arrays["words"] = np.asarray(scored["words"], dtype=np.int64)
    arrays["token_bytes"] = scored["token_bytes"]
    meta = {"row": scored["row"]}
    if "spans" in scored:
        meta["spans"] = {str(L): v for L, v in scored["spans"].items()}
        arrays["targets"] = scored["targets"]
    return meta, arrays


def _book_scores(meta: dict, arrays: dict) -> dict:
    """The inverse of `_book_unit`."""
    scored = {"row": meta["row"], "nll": {k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith("nll.")},
              "words": arrays["words"].tolist(), "token_bytes": arrays["token_bytes"]}
    if "spans" in meta:
        scored["spans"] = {int(L): v for L, v in meta["spans"].items()}
        scored["targets"] = arrays["targets"]
    return scored


def _write_ppl(out: Path, results: dict, lm) -> None:
    from evalm.icl_eval.report import plot_perplexity, write_json

    write_json(out / "results.json", results)
    plot_perplexity({"": results}, out / "perplexity_vs_length.png", f"{Path(lm.name).name or lm.name}")
    _print_perplexity(results)
    print(f"wrote {out}/results.json and perplexity_vs_length.png")


def _print_perplexity(results: dict) -> None:
    """Overall rates per protocol and reference, then the fixed-position curve."""
    for name, proto in {**results["protocols"], **results["references"]}.items():
        o = proto["overall"]
        word = f"{o['word_ppl']:,.0f}" if o.get("word_ppl") else "-"
        bpb = f"{o['bits_per_byte']:.3f}" if o.get("bits_per_byte") else "-"
        print(f"{name:>11}  token ppl {o['token_ppl']:8.1f}  word ppl {word:>10}  bits/byte {bpb}  "
              f"({proto['protocol']['protocol']})")
        if proto.get("block_offsets"):
            print(f"{'':>11}  by offset in its block: "
                  + "  ".join(f"[{r['offsets'][0]}, {r['offsets'][1]}) {r['token_ppl']:.1f}" for r in proto["block_offsets"]))
    fixed = results.get("fixed_position")
    if fixed:
        cells = "  ".join(f"{r['context']}:{r['token_ppl']:.1f}" for r in fixed["rows"])
        refs = ", ".join(f"{k} {v['token_ppl']:.1f}" for k, v in fixed["references"].items())
        print(f"fixed-position token ppl by context length  {cells}  (references: {refs})")


def harness(argv: Sequence[str]) -> int:
    """Standard lm-evaluation-harness tasks through `icl_eval.harness` (extra `harness`)."""
    p = Parser(prog="evalm eval harness", description="lm-evaluation-harness tasks on a local model (extra `harness`)")
    common(p, "runs/eval-harness", None)
    p.add_argument("--tasks", type=csv(str), required=True, metavar="T1,T2",
                   help="harness task names, comma-separated; local ones via --include-path (required)")
    p.add_argument("--include-path", metavar="DIR", help="folder of task YAMLs, e.g. with "
                   "`fewshot_config: {sampler: first_n}` (default: none, the harness's own tasks)")
    p.add_argument("--num-fewshot", type=int, metavar="K", help="demonstrations per request "
                   "(default: each task's own num_fewshot)")
    p.add_argument("--seeds", type=csv(int), default=(1,), metavar="S1,S2",
                   help="one simple_evaluate per seed; mean ± std (default: 1)")
    p.add_argument("--limit", type=float, metavar="N", help="documents per task: a count, or a fraction below 1 "
                   "(default: every document)")
    p.add_argument("--batch-size", type=int, default=16, metavar="B", help="requests per forward (default: 16)")
    p.add_argument("--overflow", choices=("error", "drop_left"), default="error",
                   help="past the model's window: raise, or cut from the left and record it (default: error)")
    p.add_argument("--add-bos", action=argparse.BooleanOptionalAction, default=None,
                   help="start every context with the bos token (default: as `lm_eval --model hf` with add_bos_token "
                        "unset, i.e. what the model's tokenizer does by default: GPT-2 no, Llama yes; EVALM yes)")
    load_flags(p, LoadOptions, ("device", "dtype"))
    args = p.parse_args(argv)
    if is_tiny(args):
        raise ConfigError("evalm eval harness needs --checkpoint DIR or --hf-model DIR")
    from evalm.icl_eval.harness import evaluate as harness_evaluate
    from evalm.icl_eval.models.loading import describe, load_lm
    from evalm.icl_eval.report import write_json

    out = Path(args.out)
    source = ModelSource.of(args.checkpoint, args.hf_model, args.gguf_file, args.tokenizer)
    options = LoadOptions(**{name: getattr(args, name) for name in ("device", "dtype") if getattr(args, name)})
    with RunFolder(out, "evalm eval harness", inputs=[i for i in source.inputs() if i]).held():
        lm = load_lm(source, options, options.device)
        limit = None if args.limit is None else (int(args.limit) if args.limit >= 1 else args.limit)
        results = harness_evaluate(lm, args.tasks, args.num_fewshot, args.seeds, limit, args.include_path,
                                   batch_size=args.batch_size, overflow=args.overflow, add_bos=args.add_bos)
        results["model"] = describe(lm)
        write_json(out / "results.json", results)
    for task, metrics in results["summary"].items():
        cells = "  ".join(f"{m}: {v['mean']:.4f}±{v['std']:.4f}" for m, v in metrics.items())
        print(f"{task:>20}  {cells}  ({len(args.seeds)} seed(s))")
    if results["truncations"]:
        print(f"{len(results['truncations'])} request(s) cut from the left (recorded in results.json)")
    print(f"wrote {out}/results.json")
    return 0


COMMANDS = {
    "icl": ("many-shot ICL: incremental | concat | structured | saicl | ensemble over shots and seeds", icl),
    "ppl": ("perplexity vs context length through the cache, with re-encoding baselines", ppl),
    "harness": ("lm-evaluation-harness tasks via simple_evaluate (extra `harness`), prefix-shared cache", harness),
    "recall": ("passkey, needles, variable tracking, JSON KV and MQAR at exact lengths and depths, through the cache",
               lazy("evalm.icl_eval.recall.command:recall")),
    "recall-cells": ("the recall study's test cells of one `evalm train recall` model", lazy("evalm.icl_eval.recall.study_cells:main")),
    "recall-tables": ("the recall study's markdown tables from its folder, or where EVA's MQAR errors go (--chunk-mates)",
                      lazy("evalm.icl_eval.recall.chunk_mates:main")),
    "needle-ranks": ("where a needle's chunk ranks among a query's selection candidates: summaries, Quest's bound, exact",
                     lazy("evalm.icl_eval.recall.needle_ranks:main")),
    "saicl-positions": ("why SAICL's decoder adaptation scores low on a tuned EVALM: isolation vs shared positions",
                        lazy("evalm.icl_eval.methods.saicl_positions:main")),
    "tables": ("markdown tables of `evalm eval icl` / `ppl` results.json files (icl runs split by seed pooled: A+B+C)",
               lazy("evalm.icl_eval.tables:command")),
    "sink": ("the attention-sink test: a transformers model under EVA's window as a mask, with and without first tokens",
             lazy("evalm.icl_eval.perplexity.sink:main")),
}
DISPATCHER = Dispatcher("evalm eval", COMMANDS)
"""A user error (config_toolkit.UserError) is one line; anything else is reported as a bug (config_toolkit.report)."""
usage, main = DISPATCHER.usage, DISPATCHER.main
