"""`evalm eval recall`: what a model retrieves from far back, through the cache (docs/evaluation.md, "Recall").

    evalm eval recall --checkpoint DIR --tasks passkey,niah_single --lengths 1024,8192,65536 \\
                      --depths 0,50,100 --seeds 1,2 --out runs/recall
    torchrun --nproc_per_node=8 -m evalm.icl_eval recall --checkpoint DIR ...   # units over the ranks

Settings are the built-in defaults (`[recall]`, icl_eval/recall/config.py), then `--config FILE`,
then flags and `--recall.key=value`, which win; the effective block is printed and kept in
results.json. Bad input is one line before any scoring: an unknown family, a depth outside 0-100,
a length shorter than an item's needles and question, a model that cannot generate (an
encoder-decoder), a length past the model's window (unless overflow = drop_left), books too short.
Units (task, length, seed) are kept as they finish (OUT/units), resumed by key, and split over
torchrun ranks; rank 0 writes results.json: one cell per (task, length, depth) and the cost per item.
The flags become one typed `Invocation` in `recall` (the edge), which runs `icl` and `ppl`'s skeleton
(icl_eval/protocol/skeleton.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from evalm.config_toolkit import ConfigError, to_dict
from evalm.icl_eval.cli_args import RECALL_SECTIONS, CommandForm, invocation, is_tiny, parse_command, recall_parser
from evalm.icl_eval.models.source import LoadOptions, ModelSource, refuse_unless_decoder
from evalm.icl_eval.protocol.skeleton import Grid, Invocation, evaluate, open_store
from evalm.icl_eval.protocol.units import books_key
from evalm.icl_eval.recall.config import RecallConfig
from evalm.icl_eval.settings import built_in_sections, recorded_fields

FLAGS = {"tasks": "tasks", "lengths": "lengths", "depths": "depths", "seeds": "seeds", "items": "items",
         "haystack": "haystack", "books": "books", "save_predictions": "save_predictions"}
"""Flag attribute -> `[recall]` key (the load flags are added by `cli_args.load_keys`)."""


def recall(argv: Sequence[str]) -> int:
    from evalm.icl_eval.settings import record

    args, layers, where, config = parse_command(argv, CommandForm(recall_parser, RECALL_SECTIONS, "recall",
                                                                  RecallConfig, FLAGS))
    model_cfg, syn = built_in_sections(layers, is_tiny(args), where, need_synthetic=False)
    settings = record(layers, {"recall": config, "model": model_cfg, "synthetic": syn})
    run = invocation(args, "evalm eval recall", config, settings, model_cfg, syn)
    refuse_unless_decoder(run.source, "recall")
    if model_cfg is not None and config.eva_ablation != "none" and model_cfg.attention != "eva":
        raise ConfigError(f"--eva-ablation {config.eva_ablation}: the built-in model's attention is "
                          f"{model_cfg.attention!r}, not EVA; set --model.attention=eva or --eva-ablation none")
    if model_cfg is not None:  # the built-in model trains first: check the items with its byte tokenizer now
        from evalm.text.tokenizer import ByteTokenizer

        check_items(config, ByteTokenizer(), None)
    inputs = [*run.source.inputs(), *config.books]
    return evaluate(run, inputs, lambda folder, world: _run(run, config, inputs, folder, world))


def check_items(config, tokenizer, window: int | None) -> tuple[tuple[int, ...], str, int]:
    """Every item fits its length (and the window), checked on the texts alone: (bos, why, the longest
    haystack any item needs). A length below an item's needles + question is one error naming both."""
    from evalm.icl_eval.recall.runner import EXTRA_TOKENS, encoded_item
    from evalm.icl_eval.tasks.prompts import resolve_bos

    bos, why = resolve_bos(tokenizer, config.bos)
    longest = 0
    for task in config.tasks:
        encs = [encoded_item(task, s, i, config, tokenizer, bos)[1] for s in config.seeds for i in range(config.items)]
        fixed = max(e.fixed for e in encs)
        answer = max(2 * len(a) + EXTRA_TOKENS for e in encs for a in e.answers)
        short = [n for n in config.lengths if n < fixed]
        if short:
            raise ConfigError(f"--lengths {','.join(map(str, short))}: a {task} prompt needs {fixed} tokens before any "
                              f"haystack (instruction, needles, question); give lengths of at least {fixed}")
        over = [n for n in config.lengths if window is not None and n + answer > window]
        if over and config.overflow == "error":
            raise ConfigError(f"--lengths {','.join(map(str, over))}: with up to {answer} answer tokens a {task} prompt "
                              f"passes the model's window of {window} positions; lower --lengths, or set "
                              "--recall.overflow=drop_left to cut prompts from the left (recorded)")
        longest = max(longest, max(config.lengths) - min(e.fixed for e in encs))
    return bos, why, longest


def load(source: ModelSource, options: LoadOptions, device: str):
    """The model to score, loaded with the run's `LoadOptions` (recorded as results.json's `model_options`);
    one without an incremental cache to generate through is refused."""
    from evalm.icl_eval.models.loading import load_lm

    lm = load_lm(source, options, device)
    if not all(hasattr(lm, m) for m in ("new_state", "extend", "fork")):
        raise ConfigError(f"{lm.name}: this model has no incremental cache to generate through; recall needs a causal LM")
    return lm


def _run(run: Invocation, config: RecallConfig, inputs: list, folder, world) -> None:
    """The skeleton's body for `evalm eval recall`: the model, its items checked, the settings block, the units, the report."""
    from evalm.icl_eval.recall.haystacks import Haystacks
    from evalm.icl_eval.recall.runner import Runner

    lm = load(run.source, run.options, world.device(run.options.device))
    bos, why, longest = check_items(config, lm.tokenizer, lm.max_positions)
    store = open_store(run, folder, world, lambda: {"command": "recall", "settings": run.settings,
                                                   "model": run.source.key(folder),
                                                   "books": books_key(folder, config.books)}, inputs)
    books = config.haystack == "books" and any(t != "passkey" for t in config.tasks)
    haystacks = Haystacks(lm.tokenizer, config.books, longest if books else 0)
    store.prepare()  # after every check of the input, before any scoring
    window = lm.max_positions if config.overflow == "drop_left" else None
    runner = Runner(lm, config, bos, haystacks, window)
    units = runner.units()
    grid = Grid(store, [f"{i:05d}-{u.name}" for i, u in enumerate(units)], run.command, per_unit=config.items)
    runner.progress = grid.progress.tick
    t0 = time.perf_counter()
    loaded = grid.run(lambda i: (runner.run_unit(units[i]), None))
    if loaded is not None:  # rank 0: every unit, in order
        from evalm.icl_eval.models.loading import describe
        from evalm.icl_eval.recall.report import results, write

        metas = [meta for meta, _ in loaded]
        data = results(metas, config, {"model": describe(lm), "model_options": recorded_fields(to_dict(run.options)),
                                       "settings": run.settings, "bos": {"tokens": list(bos), "why": why}})
        data["seconds"], data["execution"] = time.perf_counter() - t0, grid.execution()
        write(run.out, data, metas, config)
