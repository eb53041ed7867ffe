"""Evaluation configs: `[eval]` (many-shot ICL protocol and method knobs) and `[ppl]` (perplexity).

Built with `evalm.config.build`, so an unknown key names the file, the section and the valid keys.
The method knobs live in `icl_eval.methods.decoder.MethodOptions` (section `[eval.method]`) and the
synthetic family in `icl_eval.tasks.synthetic.SyntheticConfig` (section `[synthetic]`).
"""

from __future__ import annotations

from typing import Literal

from pydantic.dataclasses import dataclass

from evalm.config_toolkit import ConfigError, FROZEN
from evalm.eva_settings import EvaAblation

MAX_SELECT = 4096
"""Chunks a query may select at evaluation time, at most (`eva_select`)."""
PAPER_SHOTS = (0, 1, 3, 4, 8, 16, 32, 64, 80, 128, 192, 256, 372, 512, 640, 768, 896, 1024, 1280, 1536, 1792, 2000)
"""EVALM Appendix C.1."""


@dataclass(config=FROZEN, frozen=True)
class RunOptions:
    """How any scored model runs, declared once: every command's section inherits these keys (`[eval]`, `[ppl]`,
    `[recall]`), `cli_args.load_flags` offers them as flags, `models.source.LoadOptions` carries them to a loader."""

    device: str = "cpu"
    """Torch device of the model (`cuda` becomes `cuda:LOCAL_RANK` under torchrun)."""
    dtype: Literal["float32", "float64", "bfloat16", "float16"] = "float32"
    """Model dtype (scores and NLLs are computed in float32 or wider)."""
    eva_ablation: EvaAblation = "none"
    """EVA's component ablation at evaluation time (evalm/tiling.py, `Ablation`): `no-remote` switches the chunk
    summaries off (the window alone), `chunk-window` cuts the local window to the query's chunk (the summaries
    carry everything else). A model without EVA attention is refused with anything but none."""
    eva_select: int | None = None
    """EVA with selection read at evaluation time (docs/eva.md, "Selection"): every EVA layer also reads exactly
    the tokens of the k chunks its summaries score highest, in place of those summaries; 0: none; unset: the
    model's own setting. A model without EVA attention is refused with k > 0."""

    def __post_init__(self) -> None:
        from evalm.config_toolkit.device import check_device

        check_device(self.device, "device")  # cuda on a CPU build of torch: one line, before any loading
        if self.eva_select is not None and not 0 <= self.eva_select <= MAX_SELECT:
            raise ConfigError(f"eva_select = {self.eva_select}: from 0 (no selection) to {MAX_SELECT} chunks "
                              "(selection reads a few chunks, e.g. 1 to 8)")


@dataclass(config=FROZEN, frozen=True)
class WindowedRunOptions(RunOptions):
    """`RunOptions` and a context window: the sections that read prompts (`[eval]`, `[recall]`); perplexity reads
    every book through the cache whatever the window, so `[ppl]` has none."""

    context_window: int | None = None
    """Override the model's window (EVALM: no limit; HF: max_position_embeddings)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.context_window is not None and self.context_window < 1:
            raise ConfigError(f"context_window must be >= 1 when set, got {self.context_window}")


@dataclass(config=FROZEN, frozen=True)
class EvalConfig(WindowedRunOptions):
    """Many-shot ICL protocol (docs/evaluation.md)."""

    task: str = "synthetic"
    """A built-in task name (see `tasks.TEMPLATE_SETS`), `synthetic`, or a task file (.toml/.yaml)."""
    template_set: Literal["evalm", "structured", "helmet"] = "evalm"
    """EVALM Table 8 templates, Structured Prompting Appendix A, or HELMET's ICL tasks."""
    data: str | None = None
    """Folder of train/validation/test files, a save_to_disk folder, or a cached dataset id (`task_data`);
    None: the task file's own files, or the built-in task's dataset from the offline cache."""
    methods: tuple[str, ...] = ("incremental", "concat", "structured", "saicl")
    """Methods to run (icl_eval.methods.decoder.METHODS)."""
    shots: tuple[int, ...] = (0, 1, 4, 16, 32)
    """Demonstrations per prompt (the paper's list is config.PAPER_SHOTS)."""
    seeds: tuple[int, ...] = (1, 2, 3)
    """One demonstration draw per seed; results give mean and std over seeds."""
    selection: Literal["random", "topk"] = "random"
    """Dataset-level seeded sampling, or instance-level Top-k by TF-IDF."""
    balanced: bool = False
    """Label-balanced dataset-level sampling."""
    separator: Literal["newline", "eos", "space-newline", "blank-line"] = "newline"
    """Between demonstrations (docs/evaluation.md)."""
    bos: str = "auto"
    """Tokens a prompt starts with (prompts.resolve_bos): `auto` the model's own (EVALM `</s>`; HF: the
    tokenizer's BOS, none for GPT-2 style), `none`, `eos`, or one token spelled out; recorded in results.json."""
    calibration: Literal["none", "contextual", "pmi"] = "none"
    """Zhao et al.'s contextual calibration, or PMI against an "N/A" input."""
    test_items: int | None = None
    """Score a sample of this many test items (docs/evaluation.md), recorded by index in results.json;
    None scores the whole split."""
    test_items_order: Literal["random", "first"] = "random"
    """How `test_items` are chosen: a seeded random sample (default), or the first N in file order,
    only on explicit request (test files are often sorted by label, so a head is biased)."""
    test_items_seed: int = 0
    """Seed of the test-item sample; one sample for every demonstration seed, so seeds share items."""
    validation_items: int = 500
    """Held out from train when the data has no validation split (EVALM §4.1)."""
    choose_shot_on_validation: bool = False
    """Also score the validation split and report test accuracy at its best shot, per method."""
    save_predictions: bool = False
    """Write predictions.jsonl: every candidate's score per item, method, shot and seed."""
    budgets: tuple[int, ...] = ()
    """Token budgets (HELMET / ManyICLBench): per cell the largest prefix of the seed's demonstration
    order whose prompt fits, in the model's tokens (`icl_eval.protocol.budget`); 0 is the no-demonstration
    reference. Non-empty: the grid is by budget instead of `shots`. Empty: by shots."""
    label_map: Literal["none", "int", "symbols", "flip"] = "none"
    """Labels spelled as shuffled integers, abstract symbols or another label's word, per draw seed
    (`icl_eval.protocol.label_map`); the mapping is recorded in results.json."""
    order: tuple[Literal["random", "label-sorted", "interleaved"], ...] = ("random",)
    """Arrangement of each drawn set (`icl_eval.protocol.order`); the first is the main one, any other is scored
    on the same draws as a paired comparison (`<method>+<order>` in the summary)."""
    order_seeds: tuple[int, ...] = ()
    """Order seeds, apart from the draw seeds: every draw is scored in each order, and the summary
    splits the spread into draws and orders (`order_split`). Empty: one order per draw."""
    nearest: tuple[Literal["remove", "keep", "corrupt"], ...] = ()
    """Nearest-demonstration diagnostics (`icl_eval.protocol.nearest`), each scored beside the full context."""
    nearest_k: int = 1
    """How many of the context's demonstrations most similar to the test item the diagnostics touch."""
    nearest_embedding: str | None = None
    """A local Hugging Face encoder folder: the diagnostics' similarity is the cosine of its mean-pooled
    last hidden states instead of TF-IDF (`icl_eval.protocol.nearest.Embedder`). None: TF-IDF."""

    def __post_init__(self) -> None:
        from evalm.icl_eval.methods.decoder import METHODS

        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ConfigError(f"unknown method(s) {unknown}; valid: {list(METHODS)}")
        for name in ("methods", "shots", "seeds", "order"):
            _distinct(name, getattr(self, name))
        if self.order_seeds:  # empty: the draw's own order
            _distinct("order_seeds", self.order_seeds)
        if any(k < 0 for k in self.shots):
            raise ConfigError(f"shots must be >= 0, got {list(self.shots)}")
        super().__post_init__()
        if self.validation_items < 1:
            raise ConfigError(f"validation_items must be >= 1, got {self.validation_items}")
        if any(b < 0 for b in self.budgets) or list(self.budgets) != sorted(set(self.budgets)):
            raise ConfigError(f"budgets must be distinct, increasing and >= 0, got {list(self.budgets)}")
        if (self.budgets or self.nearest) and self.selection != "random":
            raise ConfigError("budgets and nearest-demonstration diagnostics need selection = random "
                              "(one dataset-level draw per seed)")
        if self.nearest_k < 1:
            raise ConfigError(f"nearest_k must be >= 1, got {self.nearest_k}")
        if self.test_items is not None and self.test_items < 1:
            raise ConfigError(f"test_items must be >= 1 (or unset for the whole split), got {self.test_items}")


def _distinct(name: str, values: tuple) -> None:
    """A list setting holds at least one value and none twice (`seeds=1,1` is one draw, not two)."""
    if not values:
        raise ConfigError(f"{name} is empty; give at least one value")
    repeated = sorted({str(v) for v in values if values.count(v) > 1})
    if repeated:
        raise ConfigError(f"{name} repeats {', '.join(repeated)}; give each value once")


@dataclass(config=FROZEN, frozen=True)
class PerplexityConfig(RunOptions):
    """Perplexity vs context length (docs/evaluation.md, EVALM §4.4)."""

    books: tuple[str, ...] = ()
    """Folders of .txt books (PG-19's split folders), .txt or jsonl/parquet files, saved folders, or a
    cached dataset id with a split (`deepmind/pg19:test`); see `icl_eval.perplexity.books`."""
    max_books: int | None = None
    """Read at most this many books (folders: sorted by file name; datasets: in row order); None: all."""
    max_tokens: int | None = None
    """Tokens scored per book: must equal the largest bucket (None: the largest bucket); a book
    shorter than that is scored to its end and counted only in the buckets it reaches."""
    segment_tokens: int = 8192
    """Incremental-encoding segment (the training length)."""
    buckets: tuple[int, ...] = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144)
    """Upper ends of the position buckets; a token at position p falls in the first bucket > p. At least
    one book must reach the largest (`icl_eval.protocol.supply`), else an error or, with --allow-skip, a skip."""
    baselines: tuple[Literal["nonoverlap", "sliding"], ...] = ("nonoverlap", "sliding")
    """Re-encoding baselines on the same books."""
    window_tokens: int | None = None
    """Window of the baselines (default: segment_tokens)."""
    stride_tokens: int | None = None
    """Stride of the sliding baseline (default: window / 2)."""
    unigram_shards: str | None = None
    """Token-shard folder the model was pretrained on: fits the unigram reference (docs/evaluation.md)."""
    fixed_contexts: tuple[int, ...] = ()
    """Context lengths of the fixed-position protocol (the same targets after each); empty: off."""
    fixed_target_tokens: int = 128
    """Target span of the fixed-position protocol, in tokens."""
    fixed_targets_per_book: int = 4
    """Target spans per book in the fixed-position protocol."""
    offset_block: int | None = None
    """Also report token perplexity by a token's offset inside blocks of this many tokens (a converted model's
    EVA window w: its first tokens of a block see few exact keys), over the positions from one block on; None: off."""
    past_positions: bool = False
    """Score past the model's trained positions (a transformers model's max_position_embeddings: RoPE read
    where it was never trained) instead of refusing; what the original of a conversion does past its window."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_books is not None and self.max_books < 1:
            raise ConfigError(f"max_books must be >= 1 (or unset for every book), got {self.max_books}")
        for name in ("max_tokens", "window_tokens", "stride_tokens", "offset_block"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1 (or unset), got {getattr(self, name)}")
        for name in ("segment_tokens", "fixed_target_tokens", "fixed_targets_per_book"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        _distinct("buckets", self.buckets)
        if self.buckets[0] < 1 or list(self.buckets) != sorted(self.buckets):
            raise ConfigError(f"buckets must be positive and increasing, got {list(self.buckets)}")
        if self.baselines:
            _distinct("baselines", self.baselines)
        if self.fixed_contexts:
            _distinct("fixed_contexts", self.fixed_contexts)
            if min(self.fixed_contexts) < 1:
                raise ConfigError(f"fixed_contexts must be >= 1 token each, got {list(self.fixed_contexts)}")
        if self.books and len(set(self.books)) < len(self.books):
            raise ConfigError("books names a source twice; each book would be scored twice")
