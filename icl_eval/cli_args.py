"""The argument parsers of `evalm eval icl|ppl|harness|recall`: every option with its help and default.

Parsing, and the edge: `icl_eval.cli` turns the parsed flags into settings (`icl_eval.settings`) and,
through `invocation` here, into one typed `Invocation`; no function past the edge sees the parsed flags.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from evalm.config_toolkit import Parser, build, settable_keys, split_overrides

SECTIONS_HELP = "see docs/evaluation.md for every key and its built-in default"
ICL_SECTIONS = ("eval", "eval.method", "model", "synthetic")
"""The settings sections of `evalm eval icl`; a file or flag naming another is refused (settings.Layers)."""
PPL_SECTIONS = ("ppl", "model", "synthetic")
"""The settings sections of `evalm eval ppl`."""
RECALL_SECTIONS = ("recall", "model", "synthetic")
"""The settings sections of `evalm eval recall`."""


def _listed(sections: Sequence[str]) -> str:
    return ", ".join(f"[{s}]" for s in sections)


def common(parser: Parser, out: str, sections: str | None) -> None:
    """--config (commands with settings sections), the model flags, --out."""
    if sections:
        parser.add_argument("--config", metavar="FILE", help=f"TOML file with {sections} sections; read only when "
                            f"given (default: none, the built-in defaults; {SECTIONS_HELP})")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--checkpoint", metavar="DIR", help="exported EVALM folder (model.safetensors + config.json, "
                       "written by `evalm export`) (default: none, the built-in tiny model trained on the synthetic family)")
    group.add_argument("--hf-model", metavar="DIR", help="local Hugging Face causal LM folder, or a T5 folder "
                       "(encoder-decoder) (default: none)")
    parser.add_argument("--gguf-file", metavar="FILE", help="with --hf-model: a GGUF file inside the folder, "
                        "e.g. SmolLM2 (default: none, safetensors weights)")
    parser.add_argument("--tokenizer", metavar="PATH", help="tokenizer.json, a SentencePiece .model, or `bytes` "
                        "(default: the checkpoint's tokenizer.json, else bytes)")
    parser.add_argument("--out", default=out, metavar="DIR", help=f"output folder (default: {out})")
    if sections:
        parser.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override one setting, "
                            "e.g. --set eval.calibration=pmi; repeatable; `--eval.calibration=pmi` is the same "
                            "(default: none; every key below)")


LOAD_HELP = {
    "device": "torch device of the model, e.g. cuda (cuda:LOCAL_RANK under torchrun)",
    "dtype": "model dtype; scores and NLLs are computed in float32 or wider",
    "context_window": "override the model's window in tokens (EVALM: no limit; HF: max_position_embeddings)",
    "eva_ablation": "EVA's component ablation, kept in the settings: no-remote switches the chunk summaries off (the "
                    "window alone), chunk-window cuts the local window to the query's chunk (the summaries carry the "
                    "rest); EVA models only",
    "eva_select": "EVA with selection read at evaluation time: each query also reads exactly the tokens of the K "
                     "chunks its summaries score highest, in place of those summaries (docs/eva.md, \"Selection\"); "
                     "0 none; EVA models only; unset, the model's own",
}
"""Help of each model-loading flag (models.source.LoadOptions); each flag is added by `load_flags` alone."""


def load_flags(parser: Parser, cls, names: Sequence[str] | None = None) -> None:
    """The model-loading options (models.source.LoadOptions, declared there once) as flags: --device, --dtype,
    --context-window, --eva-ablation, --eva-select, those of `names` (default: every one the section class `cls` holds),
    each with its choices and `cls`'s default. Unset, a flag is None and the section's value stands."""
    import dataclasses
    import typing

    from evalm.config_toolkit.device import device_flag
    from evalm.icl_eval.models.source import LoadOptions

    types = {"context_window": int, "device": device_flag, "eva_select": int}
    hints = typing.get_type_hints(LoadOptions)
    for field in dataclasses.fields(LoadOptions):
        if field.name not in (names if names is not None else cls.__dataclass_fields__):
            continue
        kind = hints[field.name]
        choices = typing.get_args(kind) if typing.get_origin(kind) is typing.Literal else None
        parser.add_argument("--" + field.name.replace("_", "-"), choices=choices,
                            type=types.get(field.name, str),
                            metavar=None if choices else {"device": "DEVICE", "context_window": "N", "eva_select": "K"}[field.name],
                            help=f"{LOAD_HELP[field.name]} (default: {_default(cls, field.name)})")


def allow_skip(parser: Parser, what: str) -> None:
    parser.add_argument("--allow-skip", action="store_true", help=f"drop {what} and record the skip in "
                        "results.json (default: off, any shortfall is an error)")


def overwrite(parser: Parser) -> None:
    parser.add_argument("--overwrite", action="store_true", help="discard the finished units in OUT/units when they "
                        "were computed with other settings (default: off; a rerun of the same command resumes "
                        "them, one with other settings is refused, naming what changed)")


def csv(kind, valid: Sequence[str] = ()):
    """A comma-separated list flag: at least one value, no value twice (a repeated seed would be counted as
    two draws of one), each of `kind` and, when `valid` is given, one of those names."""
    def parse(text: str):
        values = tuple(kind(x.strip()) for x in text.split(",") if x.strip())
        if not values:
            raise argparse.ArgumentTypeError("empty list; give at least one value, comma-separated")
        repeated = sorted({str(v) for v in values if values.count(v) > 1})
        if repeated:
            raise argparse.ArgumentTypeError(f"{', '.join(repeated)} given more than once; give each value once")
        bad = [v for v in values if valid and v not in valid]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown name(s) {', '.join(bad)}; valid: {', '.join(valid)}")
        return values

    return parse


def _default(cls, name: str) -> str:
    """A config field's built-in default as the flag would spell it (so --help cannot drift from the code)."""
    value = cls.__dataclass_fields__[name].default
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _describe(*paragraphs: str) -> str:
    return "\n".join(textwrap.fill(p, 100, subsequent_indent="  ") for p in paragraphs)


def _keys(*own: str) -> str:
    """Every settable key of the command's sections with its built-in default (`--help`'s epilog)."""
    from evalm.config import ModelConfig
    from evalm.icl_eval.config import EvalConfig, PerplexityConfig
    from evalm.icl_eval.methods.options import MethodOptions
    from evalm.icl_eval.recall.config import RecallConfig
    from evalm.text.synthetic import SyntheticConfig

    classes = {"eval": EvalConfig, "eval.method": MethodOptions, "ppl": PerplexityConfig, "recall": RecallConfig}
    return settable_keys({**{name: classes[name] for name in own}, "model": ModelConfig,
                          "synthetic": SyntheticConfig})


def icl_parser() -> Parser:
    from evalm.icl_eval.config import EvalConfig
    from evalm.icl_eval.methods.decoder import METHODS
    from evalm.icl_eval.methods.finetune import schedule_help
    from evalm.icl_eval.tasks.task import TEMPLATE_SETS

    tasks = "; ".join(f"{name}: {' '.join(sorted(t))}" for name, t in TEMPLATE_SETS.items())
    p = Parser(prog="evalm eval icl", epilog=_keys("eval", "eval.method"), description=_describe(
        "Many-shot ICL evaluation: every method x shot count x seed on the test items (docs/evaluation.md).", "",
        "methods: incremental (context encoded once into the cache), concat (re-encoded per item), structured "
        "(Structured Prompting groups), saicl (SAICL), ensemble (one group per forward, scores averaged), "
        "fid (T5 only), finetune (a copy of the model fine-tuned on exactly the N demonstrations of each draw, "
        "answer-only loss on the 0-shot layout, then every item scored with 0 shots; --eval.method.finetune=full|lora, "
        "LoRA with the peft extra)",
        "finetune's fixed schedule: " + schedule_help(),
        "built-in tasks (--eval.template_set=evalm|structured): " + tasks,
        "protocol: dataset-level seeded demonstrations (or --eval.selection=topk), label baselines on the same "
        "items, bootstrap intervals; the synthetic family draws a fresh rule per seed"))
    common(p, "runs/eval-icl", _listed(ICL_SECTIONS))
    p.add_argument("--task", help="a built-in task name (its dataset is read from the offline datasets cache), "
                   "`synthetic`, or a task file .toml/.yaml (default: synthetic)")
    p.add_argument("--data", help="folder of train/validation/test files, a save_to_disk folder, or a dataset id "
                   "`id[/config]` in the offline cache (default: the task's own data)")
    p.add_argument("--methods", type=csv(str, list(METHODS)), metavar="M1,M2",
                   help=f"methods, comma-separated, from {', '.join(METHODS)} (default: {_default(EvalConfig, 'methods')})")
    p.add_argument("--shots", type=csv(int), metavar="K1,K2", help="demonstrations per prompt, comma-separated; "
                   f"each must fit the training pool (default: {_default(EvalConfig, 'shots')})")
    p.add_argument("--seeds", type=csv(int), metavar="S1,S2", help="one demonstration draw per seed, comma-separated; "
                   f"results give mean and spread over seeds (default: {_default(EvalConfig, 'seeds')})")
    p.add_argument("--test-items", type=int, metavar="N", help="score a seeded random sample of N test items, recorded "
                   "by index; N above the split size is an error (default: the whole split; "
                   "--eval.test_items_order=first takes the file's first N)")
    p.add_argument("--bos", metavar="auto|none|eos|TOKEN", help="what each prompt starts with: auto (the model's "
                   "own: EVALM </s>; HF: the token its tokenizer prepends, else its declared bos, else none), none, "
                   f"eos, or one token such as '<|endoftext|>' (default: {_default(EvalConfig, 'bos')})")
    p.add_argument("--save-predictions", action="store_true", help="write predictions.jsonl: every candidate's "
                   "score per item, method, shot and seed (default: off)")
    protocol_options(p)
    load_flags(p, EvalConfig)
    allow_skip(p, "shot counts above the training pool and a --test-items above the split (scoring all)")
    overwrite(p)
    return p


def protocol_options(p: Parser) -> None:
    """The field's many-shot protocols: token budgets, label remapping, order, nearest-demonstration arms."""
    from evalm.icl_eval.config import EvalConfig

    p.add_argument("--budgets", type=csv(int), metavar="B1,B2", help="token budgets instead of --shots: per seed the "
                   "largest prefix of its demonstration order whose prompt (context + longest test item, in the model's "
                   "tokens) fits B; 0 is the no-demonstration reference; a B below one demonstration is an error "
                   "(default: none, the grid is by --shots)")
    p.add_argument("--label-map", choices=("none", "int", "symbols", "flip"), help="spell the labels as shuffled "
                   "integers, abstract symbols or another label's word, drawn per seed and recorded "
                   f"(default: {_default(EvalConfig, 'label_map')})")
    p.add_argument("--order", type=csv(str, ("random", "label-sorted", "interleaved")), metavar="O1,O2",
                   help="arrangement of each draw: random, label-sorted or interleaved; further orders are scored on "
                   f"the same draws as paired arms (default: {_default(EvalConfig, 'order')})")
    p.add_argument("--order-seeds", type=csv(int), metavar="S1,S2", help="order seeds apart from the draw seeds: "
                   "every draw in each order; the summary splits the spread into draws and orders "
                   "(default: none, one order per draw)")
    p.add_argument("--nearest", type=csv(str, ("remove", "keep", "corrupt")), metavar="M1,M2", help="nearest-"
                   "demonstration diagnostics: per test item remove, keep only, or mislabel the --nearest-k "
                   "demonstrations most similar to it (TF-IDF), in every order seed, each item re-encoding its own "
                   "context; with 0 shots in the grid, remove gives the sample learning ratio where the gain over 0 "
                   "shots is significant (default: none)")
    p.add_argument("--nearest-embedding", metavar="DIR", help="a local Hugging Face encoder folder: the --nearest "
                   "similarity is the cosine of its mean-pooled hidden states (default: none, TF-IDF)")
    p.add_argument("--nearest-k", type=int, metavar="K", help="demonstrations the --nearest diagnostics touch; more "
                   f"than a cell's demonstrations is an error (default: {_default(EvalConfig, 'nearest_k')})")


def ppl_parser() -> Parser:
    from evalm.icl_eval.config import PerplexityConfig

    p = Parser(prog="evalm eval ppl", epilog=_keys("ppl"), description=_describe(
        "Perplexity vs context length (PG-19 protocol, docs/evaluation.md): every book scored to the largest "
        "--lengths bucket.", "", "protocols: cached (incremental encoding through the cache, every token sees its whole "
        "prefix), nonoverlap and sliding (re-encoded windows, --ppl.baselines), fixed-position (--fixed-contexts: "
        "the same targets after each context length); references: uniform, unigram (--unigram-shards)"))
    common(p, "runs/eval-ppl", _listed(PPL_SECTIONS))
    p.add_argument("--books", nargs="+", metavar="SOURCE", help="PG-19 split folder(s) of .txt books, .txt files, "
                   "jsonl/parquet files or save_to_disk folders with `text`, or a cached dataset id with a split, "
                   "e.g. deepmind/pg19:test (default: none; required unless the --config file names [ppl] books)")
    p.add_argument("--lengths", type=csv(int), metavar="L1,L2", help="position bucket upper ends, increasing; every "
                   "book is scored to the largest and at least one book must reach it "
                   f"(default: {_default(PerplexityConfig, 'buckets')})")
    p.add_argument("--max-tokens", type=int, metavar="N", help="tokens scored per book; must equal the largest "
                   "--lengths bucket (default: the largest --lengths bucket)")
    p.add_argument("--unigram-shards", metavar="DIR", help="token-shard folder the model was pretrained on: adds the "
                   "unigram reference (default: none, uniform reference only)")
    p.add_argument("--fixed-contexts", type=csv(int), metavar="C1,C2", help="context lengths of the fixed-position "
                   "protocol (the same targets after each), e.g. 16,256,4096 (default: none, protocol off)")
    p.add_argument("--by-offset", type=int, metavar="BLOCK", help="also report token perplexity by a token's offset "
                   "inside blocks of BLOCK tokens (a converted model's EVA window), from position BLOCK on (default: off)")
    load_flags(p, PerplexityConfig)
    allow_skip(p, "--lengths buckets that no book reaches")
    overwrite(p)
    return p


def recall_parser() -> Parser:
    from evalm.icl_eval.recall.config import FAMILIES, RecallConfig

    p = Parser(prog="evalm eval recall", epilog=_keys("recall"), description=_describe(
        "Recall through the cache (docs/evaluation.md, \"Recall\"): seeded needle families at exact lengths in the "
        "model's own tokens and needle depths, scored by exact match of greedy generation beside chance.", "",
        "families: passkey (filler haystack), niah_single, niah_multikey, niah_multivalue, niah_multiquery (RULER), "
        "variable_tracking (RULER), kv_recall (HELMET's JSON KV), mqar (Zoology's MQAR); the haystack before each "
        "needle is encoded once and forked for every depth"))
    common(p, "runs/eval-recall", _listed(RECALL_SECTIONS))
    p.add_argument("--tasks", type=csv(str, FAMILIES), metavar="T1,T2", help="families, comma-separated, from "
                   f"{', '.join(FAMILIES)} (default: all of them)")
    p.add_argument("--lengths", type=csv(int), metavar="L1,L2", help="prompt lengths in the model's own tokens, up to "
                   f"262144; each must hold an item's needles and question (default: {_default(RecallConfig, 'lengths')})")
    p.add_argument("--depths", type=csv(int), metavar="D1,D2", help="needle positions, percent of the haystack before "
                   f"the needle, 0-100 (default: {_default(RecallConfig, 'depths')})")
    p.add_argument("--seeds", type=csv(int), metavar="S1,S2", help="one set of items per seed; intervals over seeds "
                   f"and items (default: {_default(RecallConfig, 'seeds')})")
    p.add_argument("--items", type=int, metavar="N", help="items per seed, task and length, each at every depth "
                   f"(default: {_default(RecallConfig, 'items')})")
    p.add_argument("--haystack", choices=("words", "filler", "books"), help="what the needles hide in, passkey "
                   "aside (always filler): random words (the asked key's own left out; called noise before 28 Nov "
                   "2026), the filler sentences RULER calls noise, or --books sentences "
                   f"(default: {_default(RecallConfig, 'haystack')})")
    p.add_argument("--books", nargs="+", metavar="SOURCE", help="with --haystack books: .txt folders or files, "
                   "jsonl/parquet with `text`, or a cached id such as deepmind/pg19:test (default: none)")
    p.add_argument("--save-predictions", action="store_true", help="write predictions.jsonl: every prompt's "
                   "generation, extracted answer and gold (default: off)")
    load_flags(p, RecallConfig)
    overwrite(p)
    return p


def config_source(args) -> str:
    """Where a command's settings came from, for its refusals: the config file and flags, or flags alone."""
    return f"--config {args.config} and flags" if args.config else "flags and built-in defaults"


def copy_flags(layers, section: str, args, names: dict[str, str]) -> None:
    """Copy the flags the user gave (not None) into a section; `names` maps attribute -> config key."""
    for attr, key in names.items():
        value = getattr(args, attr)
        if value is not None and value is not False:
            layers.set_flag(section, key, value, "--" + attr.replace("_", "-"))


def load_keys(cls) -> dict[str, str]:
    """The load flags `load_flags` gave a command with section class `cls`: attribute -> config key."""
    from evalm.icl_eval.models.source import LoadOptions

    return {name: name for name in LoadOptions.__dataclass_fields__ if name in cls.__dataclass_fields__}


@dataclass(frozen=True)
class CommandForm:
    """What the command line of one `evalm eval` command becomes a section through: its parser, the
    sections a file or flag may name, its own section and that section's class, and which flags copy
    into it (the load flags, `load_keys`, are added)."""

    parser: Callable[[], Parser]
    sections: tuple[str, ...]
    section: str
    config: type
    flags: dict[str, str]
    """Flag attribute -> key of the command's own section."""


class Parsed(NamedTuple):
    """A command line read by `parse_command`: the flags, the settings' layers with their sources,
    where the settings came from (for error messages) and the command's own section, built."""

    args: argparse.Namespace
    layers: Any
    """`settings.Layers`: the built-in defaults, the --config file, then the flags and overrides."""
    where: str
    config: Any


def parse_command(argv: Sequence[str], form: CommandForm) -> Parsed:
    """The preamble of every `evalm eval` command: split the `--section.key=value` overrides off, parse the
    rest, layer file, overrides and flags (flags win), and build the command's own section."""
    from evalm.icl_eval.settings import Layers

    overrides, rest = split_overrides(argv)
    args = form.parser().parse_args(rest)
    layers = Layers(args.config, overrides, form.sections)
    if getattr(args, "books", None):  # nargs="+" gives a list; the section holds a tuple
        args.books = tuple(args.books)
    copy_flags(layers, form.section, args, {**form.flags, **load_keys(form.config)})
    where = config_source(args)
    return Parsed(args, layers, where, build(form.config, layers.section(form.section),
                                             where=f"{where} [{form.section}]"))


def is_tiny(args) -> bool:
    """Neither --checkpoint nor --hf-model: the built-in tiny model is scored."""
    return not (args.checkpoint or args.hf_model)


def invocation(args, command: str, section, settings: dict, model=None, synthetic=None):
    """The command line, typed once (protocol.skeleton.Invocation): the model source the flags name (its kind
    chosen by models.source), the section's load options, the output folder and the run's switches."""
    from evalm.icl_eval.models.source import LoadOptions, ModelSource
    from evalm.icl_eval.protocol.skeleton import Invocation

    source = ModelSource.of(args.checkpoint, args.hf_model, args.gguf_file, args.tokenizer, model, synthetic)
    return Invocation(command, Path(args.out), source, LoadOptions.of(section), settings, args.overwrite,
                      getattr(args, "allow_skip", False))  # recall has no --allow-skip
