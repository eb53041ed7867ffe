"""`evalm eval`: many-shot ICL (`icl`) and perplexity vs length (`ppl`). Subcommands are one dict.

    evalm eval icl                                   # tiny default: trains a tiny EVALM on the synthetic family, evaluates it
    evalm eval icl --checkpoint DIR --task sst2 --data DATA_DIR --methods incremental,concat,structured \\
                   --shots 1,16,128 --seeds 1,2,3 --out runs/icl [--save-predictions] [--eval.calibration=pmi]
    evalm eval icl --hf-model DIR ...                # a local Hugging Face causal LM (OPT/GPT-2/SmolLM2)
    evalm eval ppl --checkpoint DIR --books PG19/test --lengths 1024,8192,65536,262144 --out runs/ppl

A config file (`--config`, default configs/eval-tiny.toml when present) has sections `[eval]`,
`[eval.method]`, `[ppl]`, `[model]` and `[synthetic]`; `--section.key=value` overrides any field.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from evalm.config import ConfigError, apply_overrides, build, read_toml, to_dict

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "eval-tiny.toml"


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help=f"TOML config (default: {DEFAULT_CONFIG.name} when present)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--checkpoint", help="exported EVALM folder (model.safetensors + config.json)")
    group.add_argument("--hf-model", help="local Hugging Face causal LM folder, or a T5 folder (encoder-decoder)")
    parser.add_argument("--gguf-file", help="with --hf-model: a GGUF file inside the folder (SmolLM2)")
    parser.add_argument("--tokenizer", help="tokenizer.json/.model/`bytes` (default: the checkpoint's, else bytes)")
    parser.add_argument("--out", default=None, help="output folder")


def _csv(kind):
    return lambda text: tuple(kind(x) for x in text.split(",") if x)


def _load_config(args, overrides: Sequence[str]) -> dict[str, Any]:
    path = args.config or (DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None)
    data = read_toml(path) if path else {}
    data = apply_overrides(data, overrides)
    data["_where"] = str(path or "defaults")
    return data


def _split_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """`--section.key=value` overrides vs ordinary arguments."""
    overrides, rest = [], []
    for a in argv:
        if a.startswith("--") and "." in a.split("=", 1)[0] and "=" in a:
            overrides.append(a[2:])
        else:
            rest.append(a)
    return overrides, rest


def _load_lm(args, device: str, dtype: str, data: dict, context_window: int | None, where: str):
    import torch

    from evalm.tokenizer import load_tokenizer
    from icl_eval.lm import EvalmLM

    if args.hf_model:
        from icl_eval.hf import load_hf

        tok = load_tokenizer(args.tokenizer) if args.tokenizer else None
        from icl_eval.t5 import is_t5_folder, load_t5

        if is_t5_folder(args.hf_model):  # encoder-decoder: concat | saicl | fid | ensemble (icl_eval/encdec_methods.py)
            return load_t5(args.hf_model, tokenizer=tok, dtype=dtype, device=device)
        lm = load_hf(args.hf_model, tokenizer=tok, dtype=dtype, device=device, gguf_file=args.gguf_file)
        if context_window:
            lm.max_positions = context_window
        return lm
    if args.checkpoint:
        from evalm.io import load_model

        ckpt = Path(args.checkpoint)
        tok_path = args.tokenizer or (ckpt / "tokenizer.json" if (ckpt / "tokenizer.json").is_file() else None)
        model = load_model(ckpt, device=device, dtype=getattr(torch, dtype))
        return EvalmLM(model, load_tokenizer(tok_path), name=str(ckpt), max_positions=context_window)
    return _tiny_default(data, where, context_window)


def _tiny_default(data: dict, where: str, context_window: int | None):
    """The embedded default: a tiny EVALM trained here on the synthetic family (seconds on a CPU)."""
    import torch

    from evalm import EvalmModel, ModelConfig
    from evalm.tokenizer import ByteTokenizer
    from icl_eval.lm import EvalmLM
    from icl_eval.synthetic import SyntheticConfig, train_tiny_model

    model_cfg = build(ModelConfig, data.get("model"), where=f"{where} [model]")
    syn = build(SyntheticConfig, data.get("synthetic"), where=f"{where} [synthetic]")
    torch.manual_seed(syn.seed)
    model = EvalmModel(model_cfg)
    model.init_weights()
    print(f"no --checkpoint: training a tiny EVALM ({model_cfg.attention}) on the synthetic family, {syn.train_steps} steps")
    losses = train_tiny_model(model, syn, log_every=max(1, syn.train_steps // 5))
    lm = EvalmLM(model, ByteTokenizer(), name=f"tiny synthetic-trained EVALM (final loss {losses[-1]:.3f})",
                 max_positions=context_window)
    return lm


def _describe(lm) -> dict:
    desc = lm.describe()
    desc["tokenizer"] = getattr(lm.tokenizer, "name", None) or str(getattr(lm.tokenizer, "path", type(lm.tokenizer).__name__))
    return desc


def _progress(total: int, desc: str):
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit="item", dynamic_ncols=True, file=sys.stderr)
    return bar


def icl(argv: Sequence[str]) -> int:
    from icl_eval.config import EvalConfig
    from icl_eval.methods import MethodOptions
    from icl_eval.protocol import Runner, select_items
    from icl_eval.summary import summarize
    from icl_eval.report import plot_accuracy, plot_time, write_json, write_predictions
    from icl_eval.synthetic import SyntheticConfig, episode, synthetic_task
    from icl_eval.task_data import task_splits
    from icl_eval.tasks import get_task

    overrides, rest = _split_args(argv)
    p = argparse.ArgumentParser(prog="evalm eval icl", description="many-shot ICL evaluation")
    _common(p)
    p.add_argument("--task", help="built-in task name (its dataset is read from the offline datasets cache), "
                                  "`synthetic`, or a task file (.toml/.yaml) (default: [eval] task, `synthetic`)")
    p.add_argument("--data", help="folder of train/validation/test files, a save_to_disk folder, or a dataset id "
                                  "`id[/config]` in the offline cache (default: the task's own data)")
    p.add_argument("--methods", type=_csv(str))
    p.add_argument("--shots", type=_csv(int))
    p.add_argument("--seeds", type=_csv(int))
    p.add_argument("--test-items", type=int, help="score a seeded random sample of N test items, recorded by index "
                   "(default: the whole split; --eval.test_items_order=first takes the file's first N)")
    p.add_argument("--bos", help="what each prompt starts with: auto (the model's own: EVALM </s>; HF: its tokenizer's "
                   "BOS, none for GPT-2 style), none, eos, or one token such as '<|endoftext|>' (default: auto)")
    p.add_argument("--save-predictions", action="store_true")
    args = p.parse_args(rest)
    data = _load_config(args, overrides)
    where = data.pop("_where")
    section = dict(data.get("eval", {}))
    method_section = section.pop("method", {})
    for key in ("task", "data", "methods", "shots", "seeds", "test_items", "bos"):
        if getattr(args, key) is not None:
            section[key] = getattr(args, key)
    if args.save_predictions:
        section["save_predictions"] = True
    config = build(EvalConfig, section, where=f"{where} [eval]")
    options = build(MethodOptions, method_section, where=f"{where} [eval.method]")
    out = Path(args.out or "runs/eval-icl")

    data_info = {"source": "synthetic"}
    if config.task == "synthetic":
        syn = build(SyntheticConfig, data.get("synthetic"), where=f"{where} [synthetic]")
        task = synthetic_task(syn)
        splits_for_seed = lambda seed: episode(seed, syn)  # noqa: E731 (a fresh rule per seed)
    else:
        task = get_task(config.task, config.template_set)
        splits, data_info = task_splits(task, config.task, config.data)
        splits_for_seed = lambda seed: splits  # noqa: E731

    if config.task != "synthetic" and not (args.checkpoint or args.hf_model):
        raise ConfigError("a real task needs --checkpoint DIR or --hf-model DIR (the tiny default knows only `synthetic`)")
    lm = _load_lm(args, config.device, config.dtype, data, config.context_window, where)
    n_items = len(select_items(len(splits_for_seed(config.seeds[0])["test"]), config))
    parts = 2 if config.choose_shot_on_validation else 1
    bar = _progress(n_items * len(config.shots) * len(config.methods) * len(config.seeds) * parts, "icl")
    t0 = time.perf_counter()
    runner = Runner(lm, task, config, options, splits_for_seed, progress=bar.update)
    label_tokens = runner.prompt.label_token_counts()
    if len(set(label_tokens.values())) > 1 and options.scoring.endswith("-sum"):
        print(f"warning: the labels tokenize to unequal lengths {label_tokens}: {options.scoring} scores favour the "
              "shorter ones; consider --eval.method.scoring=answer-mean or another verbalizer", file=sys.stderr)
    records = runner.run()
    bar.close()
    summary = summarize(records, runner.baselines)
    results = {
        "protocol": {"model": _describe(lm), "task": task.name, "template": task.template,
                     "template_source": task.source, "labels": list(task.labels), "data": data_info,
                     "label_tokens": label_tokens, "bos": runner.prompt.describe_bos(),
                     "eval": to_dict(config),
                     "method_options": to_dict(options), "scoring": options.scoring,
                     "seconds": time.perf_counter() - t0},
        "summary": summary,
        "records": records,
        "baseline_records": runner.baselines,
    }
    write_json(out / "results.json", results)
    write_json(out / "config.json", {"eval": to_dict(config), "eval.method": to_dict(options)})
    if config.save_predictions:
        write_predictions(out / "predictions.jsonl", runner.predictions)
    title = f"{task.name} - {Path(lm.name).name or lm.name}"
    plot_accuracy({"": summary}, out / "accuracy_vs_shots.png", title)
    plot_time(summary, out / "time_per_item_vs_shots.png", title)
    _print_summary(summary)
    print(f"wrote {out}/results.json and plots")
    return 0


def _print_summary(summary: dict) -> None:
    """One line per method: accuracy [95% interval] per shot, then the best baseline per shot."""
    def ci(c):
        return f"[{c[0]:.2f}, {c[1]:.2f}]"

    for method, shots in summary["test"].items():
        ordered = sorted(shots.items(), key=lambda kv: int(kv[0]))
        cells = "  ".join(f"{k}:{v['accuracy_mean']:.3f} {ci(v['accuracy_ci95'])}" for k, v in ordered)
        print(f"{method:>12}  {cells}")
    ordered = sorted(next(iter(summary["test"].values())).items(), key=lambda kv: int(kv[0]))
    cells = "  ".join(f"{k}:{v['baselines'][v['gain']['over']]['mean']:.3f} ({v['gain']['over']})" for k, v in ordered)
    print(f"{'best label baseline':>12}  {cells}")
    for method, best in summary.get("best_shot", {}).items():
        print(f"{method:>12}  best shot on validation {best['best_shot']}: test {best['test_accuracy']:.3f}")


def ppl(argv: Sequence[str]) -> int:
    from icl_eval.config import PerplexityConfig
    from icl_eval.books import iter_books
    from icl_eval.perplexity import evaluate
    from icl_eval.report import plot_perplexity, write_json
    from icl_eval.unigram import fit_unigram

    overrides, rest = _split_args(argv)
    p = argparse.ArgumentParser(prog="evalm eval ppl", description="perplexity vs context length (PG-19 protocol)")
    _common(p)
    p.add_argument("--books", nargs="+", help="PG-19 split folder(s) of .txt books, .txt files, jsonl/parquet files "
                                              "or save_to_disk folders with `text`, or a cached dataset id with a "
                                              "split, e.g. deepmind/pg19:test (default: [ppl] books)")
    p.add_argument("--lengths", type=_csv(int), help="bucket upper ends, e.g. 1024,8192,262144")
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--unigram-shards", help="token-shard folder the model was pretrained on: adds the unigram reference")
    p.add_argument("--fixed-contexts", type=_csv(int),
                   help="context lengths of the fixed-position protocol (the same targets after each), e.g. 16,256,4096")
    args = p.parse_args(rest)
    data = _load_config(args, overrides)
    where = data.pop("_where")
    section = dict(data.get("ppl", {}))
    if args.books:
        section["books"] = tuple(args.books)
    if args.lengths:
        section["buckets"] = args.lengths
        section.setdefault("max_tokens", max(args.lengths))
    if args.max_tokens:
        section["max_tokens"] = args.max_tokens
    if args.unigram_shards:
        section["unigram_shards"] = args.unigram_shards
    if args.fixed_contexts:
        section["fixed_contexts"] = args.fixed_contexts
    config = build(PerplexityConfig, section, where=f"{where} [ppl]")
    if not config.books:
        raise ConfigError("give --books (a PG-19 split folder, .txt files, train/samples/documents.jsonl, "
                          "or deepmind/pg19:test from the datasets cache)")
    lm = _load_lm(args, config.device, config.dtype, data, None, where)
    books = iter_books(config.books, config.max_books)  # lazily: one book in memory at a time
    bar = _progress(config.max_books, "ppl")
    t0 = time.perf_counter()
    unigram = fit_unigram(config.unigram_shards, lm.tokenizer.vocab_size) if config.unigram_shards else None
    fixed = {"contexts": config.fixed_contexts, "target_tokens": config.fixed_target_tokens,
             "targets_per_book": config.fixed_targets_per_book} if config.fixed_contexts else None
    results = evaluate(lm, books, config.max_tokens, config.segment_tokens, config.buckets, config.baselines,
                       config.window_tokens, config.stride_tokens, progress=bar.update, unigram_logp=unigram, fixed=fixed)
    bar.close()
    results["model"] = _describe(lm)
    results["config"] = to_dict(config)
    results["seconds"] = time.perf_counter() - t0
    out = Path(args.out or "runs/eval-ppl")
    write_json(out / "results.json", results)
    plot_perplexity({"": results}, out / "perplexity_vs_length.png", f"{Path(lm.name).name or lm.name}")
    _print_perplexity(results)
    print(f"wrote {out}/results.json and perplexity_vs_length.png")
    return 0


def _print_perplexity(results: dict) -> None:
    """Overall rates per protocol and reference, then the fixed-position curve."""
    for name, proto in {**results["protocols"], **results["references"]}.items():
        o = proto["overall"]
        word = f"{o['word_ppl']:,.0f}" if o.get("word_ppl") else "-"
        bpb = f"{o['bits_per_byte']:.3f}" if o.get("bits_per_byte") else "-"
        print(f"{name:>11}  token ppl {o['token_ppl']:8.1f}  word ppl {word:>10}  bits/byte {bpb}  "
              f"({proto['protocol']['protocol']})")
    fixed = results.get("fixed_position")
    if fixed:
        cells = "  ".join(f"{r['context']}:{r['token_ppl']:.1f}" for r in fixed["rows"])
        refs = ", ".join(f"{k} {v['token_ppl']:.1f}" for k, v in fixed["references"].items())
        print(f"fixed-position token ppl by context length  {cells}  (references: {refs})")


def harness(argv: Sequence[str]) -> int:
    """Standard lm-evaluation-harness tasks through `icl_eval.harness` (extra `harness`; ICL_SPEC §7)."""
    from icl_eval.harness import evaluate
    from icl_eval.report import write_json

    p = argparse.ArgumentParser(prog="evalm eval harness", description="lm-evaluation-harness tasks on a local model")
    _common(p)
    p.add_argument("--tasks", type=_csv(str), required=True, help="harness task names (local ones via --include-path)")
    p.add_argument("--include-path", help="folder of task YAMLs (e.g. with `fewshot_config: {sampler: first_n}`)")
    p.add_argument("--num-fewshot", type=int)
    p.add_argument("--seeds", type=_csv(int), default=(1,), help="one simple_evaluate per seed; mean ± std")
    p.add_argument("--limit", type=float, help="documents per task (a count, or a fraction below 1)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--overflow", choices=("error", "drop_left"), default="error",
                   help="past the model's window: raise, or cut from the left and record it")
    p.add_argument("--add-bos", action=argparse.BooleanOptionalAction, default=None,
                   help="start every context with the bos token (default: as `lm_eval --model hf` with add_bos_token "
                        "unset, i.e. what the model's tokenizer does by default: GPT-2 no, Llama yes; EVALM yes)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64", "bfloat16", "float16"))
    args = p.parse_args(argv)
    if not (args.checkpoint or args.hf_model):
        raise ConfigError("evalm eval harness needs --checkpoint DIR or --hf-model DIR")
    lm = _load_lm(args, args.device, args.dtype, {}, None, "harness")
    limit = None if args.limit is None else (int(args.limit) if args.limit >= 1 else args.limit)
    results = evaluate(lm, args.tasks, args.num_fewshot, args.seeds, limit, args.include_path,
                       batch_size=args.batch_size, overflow=args.overflow, add_bos=args.add_bos)
    results["model"] = _describe(lm)
    out = Path(args.out or "runs/eval-harness")
    write_json(out / "results.json", results)
    for task, metrics in results["summary"].items():
        cells = "  ".join(f"{m}: {v['mean']:.4f}±{v['std']:.4f}" for m, v in metrics.items())
        print(f"{task:>20}  {cells}  ({len(args.seeds)} seed(s))")
    if results["truncations"]:
        print(f"{len(results['truncations'])} request(s) cut from the left (recorded in results.json)")
    print(f"wrote {out}/results.json")
    return 0


COMMANDS: dict[str, tuple[Callable[[Sequence[str]], int], str]] = {
    "icl": (icl, "many-shot ICL: incremental | concat | structured | saicl | ensemble over shots and seeds"),
    "ppl": (ppl, "perplexity vs context length through the cache, with re-encoding baselines"),
    "harness": (harness, "lm-evaluation-harness tasks via simple_evaluate (extra `harness`), prefix-shared cache"),
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        width = max(map(len, COMMANDS))
        rows = "\n".join(f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items())
        print(f"usage: evalm eval COMMAND [ARGS...]\n\ncommands:\n{rows}\n")
        return 0
    if argv[0] not in COMMANDS:
        print(f"evalm eval: unknown command {argv[0]!r}; valid: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        return int(COMMANDS[argv[0]][0](argv[1:]) or 0)
    except ConfigError as err:
        print(f"evalm eval {argv[0]}: {err}", file=sys.stderr)
        return 2
