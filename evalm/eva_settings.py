"""EVA's settings, the one schema: `EvaSettings` (the attention's rule and maps), `RotaryPlacement`
(where a rotary host puts EVA's keys), the sink rule that ties them (`check_sink_rule`) and how a
converted model's maps start (`MapInit`). Data only: this module imports no torch.

Three hosts hold them, each reading the same fields:
- `ModelConfig` (evalm/config.py) is an `EvaSettings` plus a decoder's shape: the `[model]` section of a
  run file, and the defaults below, which are the EVA LM recipe's (window 128, chunk 8);
- `evalm convert` (train/convert.py) holds an `EvaSettings` and a `RotaryPlacement` read from its `[eva]`
  keys over its own starting values, `CONVERTED_EVA` and `CONVERTED_PLACEMENT` there (window 1024,
  chunk 16, the window's chunks excluded, maps without LayerNorm, so that the zero-step model is the
  original wherever the window covers the input; a circular period of the source's own length), and
  checks the sink rule once, when they are read;
- a converted model's `config.json` (`evalm` section, evalm/hf_llama.py) holds both classes' fields; a key
  it omits takes the default here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, get_args

from pydantic.dataclasses import dataclass

from evalm.config_toolkit import FROZEN, ConfigError

MapInit = Literal["identity", "mean-key", "reference"]
"""How a converted model's summary maps A_q/A_k start (docs/training.md, "Converting a pretrained model"): both
the identity, A_q zero and A_k the identity, or the EVA reference's draw (evalm/llama_adapter.py)."""
MAP_INITS = get_args(MapInit)


@dataclass(config=FROZEN, frozen=True)
class EvaSettings:
    """EVA's visibility rule and summary maps (docs/eva.md; the field names are the public reference's)."""

    window_size: int = 128
    """w: length of the causal local block (docs/model.md; the EVA LM recipe's 128)."""
    chunk_size: int = 8
    """c: tokens compressed into one remote summary; window_size must be a multiple of it."""
    overlap_window: bool = False
    """Each block also sees the whole previous block (ext = w)."""
    use_t5_bias: bool = False
    """T5 relative-position bias inside the local block, shared across heads (§1.2)."""
    exclude_window_chunks: bool = False
    """EvaByte semantics (§1.7): chunks inside the query's own block are not remote entries."""
    sink_tokens: int = 0
    """S: the first S tokens stay exact keys of every later query, in place of their chunks' summaries
    (attention sinks, Xiao et al. 2024, §3.2; docs/eva.md, "Sink tokens"); a multiple of chunk_size, 0: none."""
    adaptive_proj: Literal["qk", "no-ln"] = "qk"
    """A_q/A_k: Linear+LayerNorm ('qk') or Linear only ('no-ln'); the reference's 'default' crashes."""
    select_chunks: int = 0
    """k: each query also reads exactly the tokens of the k remote chunks whose summaries score highest in its
    softmax, in place of those summaries (docs/eva.md, "Selection"; NSA's selection branch); 0: EVA as published."""
    select_only: bool = False
    """With select_chunks: the summaries only choose; the softmax reads the window, the sink and the selected tokens,
    no summary (window + selection)."""
    select_by: Literal["summary", "bound", "window-bound"] = "summary"
    """With select_chunks, what ranks the candidate chunks: 'summary', the summary's logit in EVA's joint softmax;
    'bound', Quest's upper bound on the chunk's best token logit from its keys' per-channel minima and maxima
    (Tang et al. 2024, §3.3; no training: for a model whose summaries were never trained to route);
    'window-bound', the same bound over the chunk's keys placed right before the query's window, where
    selected_positions = 'window' reads them: every chunk ranked at one distance (InfLLM), not at a rotary
    distance past the trained length (an EVA Llama only)."""

    def __post_init__(self) -> None:
        if self.window_size < 1:
            raise ConfigError(f"window_size must be >= 1, got {self.window_size}")
        if self.chunk_size < 1 or self.window_size % self.chunk_size:
            raise ConfigError(
                f"window_size={self.window_size} must be a positive multiple of chunk_size="
                f"{self.chunk_size}: chunks never cross block boundaries (docs/model.md)"
            )
        if self.sink_tokens < 0 or self.sink_tokens % self.chunk_size:
            raise ConfigError(
                f"sink_tokens={self.sink_tokens} must be a multiple of chunk_size={self.chunk_size} (0: no sink): the "
                "sink tokens replace whole chunks' summaries (docs/eva.md, \"Sink tokens\")"
            )
        if self.select_chunks < 0:
            raise ConfigError(f"select_chunks={self.select_chunks} must be >= 0 (0: no selection)")
        if self.select_only and not self.select_chunks:
            raise ConfigError("select_only without select_chunks: nothing is selected, so the softmax would read the "
                              "window alone; set select_chunks >= 1, or select_only = false")
        if self.select_by not in ("summary", "bound", "window-bound"):
            raise ConfigError(f"select_by={self.select_by!r}: 'summary' (the summaries' logits), 'bound' (Quest's "
                              "bound from each chunk's key minima and maxima) or 'window-bound' (the bound with the "
                              "keys placed right before the window)")
        if self.select_by != "summary" and not self.select_chunks:
            raise ConfigError(f"select_by={self.select_by!r} without select_chunks: nothing is selected; set "
                              "select_chunks >= 1, or select_by = 'summary'")


EVA_FIELDS = tuple(field.name for field in dataclasses.fields(EvaSettings))
"""The keys of `EvaSettings`, in order."""

TrainingAblation = Literal["none", "no-remote"]
"""The ablations a model may also be trained under (`[uptrain] eva_ablation`): `none`; `no-remote`, the
chunk summaries off (window-only attention on EVA's own weights, the control of a conversion study)."""
EvaAblation = Literal[TrainingAblation, "chunk-window"]
"""EVA's component ablations, each the flag's spelling (evalm/tiling.py's `Ablation` applies them): the
training ones and `chunk-window`, the local keys cut to the query's chunk (the summaries carry the rest),
a reading at evaluation time only."""
ABLATIONS: tuple[str, ...] = get_args(EvaAblation)
"""The spellings of `EvaAblation`, in order."""


@dataclass(config=FROZEN, frozen=True)
class RotaryPlacement:
    """Where a rotary (RoPE) host puts EVA's keys: the Llama adapter's half of the schema (evalm/hf_llama.py)."""

    positions: Literal["rope", "circular", "block"] = "rope"
    """'rope': RoPE at each token's position; 'circular': at position i mod circular_period (EVALM §3.1's
    circular positions, applied to RoPE); 'block': at the position within the local block, i mod window_size
    (circular with M = w: every exact local offset is the original's)."""
    circular_period: int = 8192
    """M, with positions = 'circular'; 0: the host's own length (its max_position_embeddings)."""
    sink_positions: Literal["own", "window"] = "own"
    """With sink tokens: 'own', sink keys at their own positions; 'window', moved to sit right before the
    query's window (StreamingLLM's positions inside its cache), so their distance from a query stays inside
    the trained range at any length."""
    selected_positions: Literal["own", "window"] = "own"
    """With select_chunks: 'own', the selected tokens' keys at their own positions; 'window', moved to the k·c
    positions right before the query's window, in chunk order (InfLLM's placement of retrieved blocks), so a
    chunk read from 30k tokens back sits at distances the model was trained on. Moved sink keys then sit
    before them."""

    def __post_init__(self) -> None:
        if self.circular_period < 0:
            raise ConfigError(f"circular_period={self.circular_period} must be an integer >= 1, or 0 for the model's "
                              "max_position_embeddings")

    def resolved(self, window_size: int, max_positions: int) -> RotaryPlacement:
        """The placement with its period spelled out for a host of `window_size` and `max_positions`: 'block' is
        circular with M = window_size, a period of 0 is max_positions."""
        if self.positions == "rope":
            return self
        period = window_size if self.positions == "block" else self.circular_period or max_positions
        return RotaryPlacement("circular", period, self.sink_positions, self.selected_positions)

    def period(self) -> int | None:
        """M when positions are circular, else None (a resolved placement's: `resolved`)."""
        return self.circular_period if self.positions == "circular" else None


PLACEMENT_FIELDS = tuple(field.name for field in dataclasses.fields(RotaryPlacement))


def check_sink_rule(eva: EvaSettings, placement: RotaryPlacement) -> None:
    """The one check of the moves (`sink_positions` or `selected_positions` = "window"): a move needs keys to
    move (sink tokens, selected chunks), and it is a rotation that composes only with RoPE at absolute
    positions (a circular rotation wraps)."""
    for name, field, needs in (("sink_positions", "sink_tokens", "sink_tokens to a multiple of chunk_size"),
                               ("selected_positions", "select_chunks", "select_chunks >= 1")):
        if getattr(placement, name) == "own":
            continue
        if not getattr(eva, field):
            raise ConfigError(f"{name}='window' without {field}: there is nothing to place; set {needs}, or "
                              f"{name}='own'")
        if placement.positions != "rope":
            raise ConfigError(f"{name}='window' needs positions='rope': a circular rotation (positions 'circular' or "
                              "'block') wraps and does not compose")
    if eva.select_by == "window-bound" and placement.selected_positions != "window":
        raise ConfigError("select_by='window-bound' ranks the chunks where selected_positions='window' places their "
                          "tokens; set selected_positions='window', or select_by='bound'")


def evalm_section(eva: EvaSettings, placement: RotaryPlacement) -> dict[str, Any]:
    """The `evalm` section of an EVA Llama's config.json: every EVA setting, and the fields of the placement
    (resolved: `RotaryPlacement.resolved`) that differ from the plain RoPE at absolute positions (so a RoPE
    model's section names no period)."""
    section = dataclasses.asdict(eva)
    for name in ("sink_positions", "selected_positions"):
        if getattr(placement, name) != "own":
            section[name] = getattr(placement, name)
    if placement.positions == "circular":
        section |= {"positions": "circular", "circular_period": placement.circular_period}
    return section
