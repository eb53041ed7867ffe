"""The five ICL methods behind one signature, listed in one dict (`METHODS`; docs/evaluation.md).

    method(lm, prompt, demos, items, options) -> MethodResult

`lm` is a `CausalLM` (icl_eval/models/lm.py: EvalmModel or a Hugging Face model), `prompt` the
`PromptBuilder` (tokenizer, separator), `demos` the ordered demonstrations, `items` the test items
with their candidates. Every method returns a score per item and candidate, computed by the one
scoring function (`scoring.score_candidates`), plus what it actually used (`info`).

| method      | context                                                           | exactness oracle              |
|-------------|-------------------------------------------------------------------|-------------------------------|
| concat      | re-encoded with each item in one window (no cache; the baseline)  | -                             |
| incremental | encoded once into the cache, forked per item (EVALM §3.3)         | == concat (<= 1e-6, float32)  |
| structured  | M groups, each its own cache, right-aligned, merged; own + log M  | M = 1: == concat              |
| saicl       | one group per demonstration, merged, no rescale                   | order-invariant               |
| ensemble    | each demonstration alone, scores averaged (Min et al.)            | -                             |

[test prefix note] After a cache, an item's candidates share `lead` and I(x) up to the label: that
prefix is encoded once on a fork, each candidate's remaining tokens on a fork of it
(`icl_eval/methods/item_scoring.py`, `test_prefix="shared"`; `"reencode"` feeds each candidate whole).
[window note] A prompt longer than the model's window is never cut silently: `on_overflow="error"`
raises `PromptTooLong`; `"drop_left"` drops whole demonstrations from the left, per item (room =
window minus that item's longest candidate, in `concat` and `incremental` alike), and records how
many were used. [EVA alignment note] EVA's blocks and chunks count from the start of each cache, so
`structured` with one group equals `concat` exactly; with several groups under `align="mask"`
each group starts at position L - len(group), and for EVA its block/chunk alignment still counts
from its own first token (the model is told its absolute positions through `position_offset`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from evalm.config_toolkit import ConfigError
from evalm.icl_eval.methods.encoder_decoder import ENCDEC_METHODS
from evalm.icl_eval.methods.finetune import finetune
from evalm.icl_eval.models.lm import CausalLM, right_pad
from evalm.icl_eval.methods.item_scoring import SCORERS
from evalm.icl_eval.methods.options import (  # noqa: F401  (re-exported: the methods' public signature)
    Method,
    MethodOptions,
    MethodResult,
    Progress,
    PromptTooLong,
    reduce_scores,
)
from evalm.icl_eval.tasks.prompts import Demo, PromptBuilder, TestItem
from evalm.icl_eval.methods.scoring import score_candidates


# ----------------------------------------------------------------------------------------------
# helpers shared by the methods

def _longest(items: Sequence[TestItem]) -> int:
    return max((len(c.tokens) for it in items for c in it.candidates), default=0)


def _fit(prompt: PromptBuilder, demos: Sequence[Demo], room: int | None, options: MethodOptions) -> list[Demo]:
    """The demonstrations whose context fits in `room` tokens: all of them, or an error, or a left-drop."""
    demos = list(demos)
    if room is None or len(prompt.context(demos)) <= room:
        return demos
    if options.on_overflow == "error":
        raise PromptTooLong(
            f"{len(demos)} demonstrations make a {len(prompt.context(demos))}-token context but only {room} tokens fit "
            f"the window next to the test item; use fewer shots, `structured`, or on_overflow='drop_left'"
        )
    lengths = [len(d.tokens) + len(prompt.sep) for d in demos]
    total = len(prompt.context(demos))
    start = 0
    while start < len(demos) and total > room:
        total -= lengths[start]
        start += 1
    if start == len(demos):
        raise PromptTooLong(f"not even one demonstration fits the window ({room} tokens of room)")
    return demos[start:]


def _room(lm: CausalLM, test_tokens: int) -> int | None:
    if lm.max_positions is None:
        return None
    room = lm.max_positions - test_tokens
    if room < 0:
        raise PromptTooLong(f"a test item of {test_tokens} tokens exceeds the model's window of {lm.max_positions}")
    return room


def encode(lm: CausalLM, tokens: Sequence[int], position_offset: int, segment_tokens: int):
    """A new batch-1 cache holding `tokens`, encoded in segments (exact for any split)."""
    state = lm.new_state(position_offset)
    for i in range(0, len(tokens), segment_tokens):
        lm.extend(state, torch.tensor([list(tokens[i : i + segment_tokens])], dtype=torch.long))
    return state


def _logits_after(lm: CausalLM, state, item: TestItem) -> torch.Tensor:
    """Fork the cache once per candidate (one right-padded batch): the candidates' logits (C, T, V)."""
    rows = [c.tokens for c in item.candidates]
    kids = lm.fork(state, batch_size=len(rows))
    return lm.extend(kids, right_pad(rows, lm.tokenizer.eos_id))


def score_after(lm: CausalLM, state, item: TestItem, rule: str, test_prefix: str = "shared") -> list[float]:
    """Score an item's candidates after the cache `state` (left untouched), the way `test_prefix` says."""
    return SCORERS[test_prefix](lm, state, item, rule)


def _loop(items: Sequence[TestItem], progress: Progress, fn) -> list[list[float]]:
    out = []
    for item in items:
        out.append(fn(item))
        if progress:
            progress(1)
    return out


# ----------------------------------------------------------------------------------------------
# the methods

def concat(lm, prompt, demos, items, options: MethodOptions, progress: Progress = None) -> MethodResult:
    """Demonstrations then the test instance in one window, re-encoded for every item."""
    t0, used = time.perf_counter(), []

    def one(item: TestItem) -> list[float]:
        longest = max(len(c.tokens) for c in item.candidates)
        kept = _fit(prompt, demos, _room(lm, longest), options)
        used.append(len(kept))
        ctx = prompt.context(kept)
        logits = lm.forward(right_pad([tuple(ctx) + c.tokens for c in item.candidates], lm.tokenizer.eos_id))
        return score_candidates(logits[:, len(ctx):], item.candidates, options.scoring)

    scores = _loop(items, progress, one)
    info = {"demos_used": used, "context_tokens": len(prompt.context(list(demos))), "cache_reuse": False}
    return MethodResult(scores, _timed(info, t0, 0.0, len(items)))


def incremental(lm, prompt, demos, items, options: MethodOptions, progress: Progress = None) -> MethodResult:
    """EVALM's incremental encoding: the context is encoded once; each item forks the cache.

    Past the window the left-drop is decided per item, exactly as `concat` decides it (room = window
    minus that item's longest candidate), so drop_left scores what a left-dropping concat scores,
    item by item; items that keep the same demonstrations share one context encoding."""
    t0 = time.perf_counter()
    demos = list(demos)
    starts = [len(demos) - len(_fit(prompt, demos, _room(lm, _longest([it])), options)) for it in items] \
        if items else [0]
    scores: list[list[float]] = [[] for _ in items]
    t_enc, cache_bytes, contexts = 0.0, 0, []
    for start in sorted(set(starts)):
        t1 = time.perf_counter()
        ctx = prompt.context(demos[start:])
        state = encode(lm, ctx, 0, options.segment_tokens)
        t_enc += time.perf_counter() - t1
        contexts.append(len(ctx))
        cache_bytes = max(cache_bytes, lm.nbytes(state))
        for i in [i for i, s in enumerate(starts) if s == start]:
            scores[i] = score_after(lm, state, items[i], options.scoring, options.test_prefix)
            if progress:
                progress(1)
    info = {"demos_used": [len(demos) - s for s in starts][: len(items)], "context_tokens": max(contexts),
            "context_encodings": len(contexts), "cache_bytes": cache_bytes, "cache_reuse": True}
    return MethodResult(scores, _timed(info, t0, t_enc, len(items)))


@dataclass
class Group:
    demo_ids: list[int]
    tokens: list[int]
    truncated_tokens: int = 0
    padded_tokens: int = 0


def make_groups(prompt: PromptBuilder, demos: Sequence[Demo], options: MethodOptions, one_per_demo: bool = False) -> list[Group]:
    """Split the ordered demonstrations into groups `[bos] d ... d`; every demonstration lands in one.

    Unlike the public LMOps code, the last, unfilled group is kept (never dropped or miscounted).
    """
    demos = list(demos)
    if one_per_demo:
        parts = [[d] for d in demos]
    elif options.n_groups:
        parts = [list(p) for p in np.array_split(np.array(demos, dtype=object), options.n_groups) if len(p)]
    elif options.group_tokens:
        parts, current = [], []
        for d in demos:
            if current and len(prompt.context(current + [d])) > options.group_tokens:
                if options.align == "truncate":  # overfill by one, then cut from the left to exactly L
                    current.append(d)
                    parts.append(current)
                    current = []
                    continue
                parts.append(current)
                current = []
            current.append(d)
        if current:
            parts.append(current)
    else:
        parts = [demos]
    groups = [Group([d.item_id for d in p], prompt.context(p)) for p in parts]
    budget = options.group_tokens
    for g in groups:
        if budget and len(g.tokens) > budget:
            if options.align != "truncate":
                raise PromptTooLong(
                    f"a group of {len(g.demo_ids)} demonstration(s) takes {len(g.tokens)} tokens, over group_tokens="
                    f"{budget}; raise group_tokens or use align='truncate' (which records what it cuts)"
                )
            g.truncated_tokens = len(g.tokens) - budget
            g.tokens = g.tokens[-budget:]
    return groups


def _rescale_bias(options: MethodOptions, n_groups: int) -> float:
    if options.rescale == "log_m":
        return math.log(n_groups)
    return 0.0 if options.rescale == "off" else float(options.rescale)


@dataclass(frozen=True)
class Merge:
    """What `_grouped` merges: the groups, each encoded in its own cache, and the logit bias the merged
    cache gives the test's own tokens (log M rescaling, or 0)."""

    groups: list[Group]
    own_logit_bias: float


def _grouped(lm, prompt, merge: Merge, items, options, progress) -> MethodResult:
    """Encode each group in its own cache (right-aligned), merge, score every item after the merge."""
    groups, bias = merge.groups, merge.own_logit_bias
    t0 = time.perf_counter()
    L = max(len(g.tokens) for g in groups)
    if options.align in ("pad_space", "truncate") and options.group_tokens:
        L = max(L, options.group_tokens)
    room = _room(lm, _longest(items))
    if room is not None and L > room:
        raise PromptTooLong(f"groups of {L} tokens leave no room for the test item in a window of {lm.max_positions}")
    space = prompt.tokenizer.encode(" ")[:1] or [prompt.tokenizer.eos_id]
    states = []
    for g in groups:
        tokens, offset = g.tokens, L - len(g.tokens)
        if options.align == "pad_space":
            g.padded_tokens = offset
            tokens, offset = space * offset + tokens, 0
        elif options.align == "none":
            offset = 0
        states.append(encode(lm, tokens, offset, options.segment_tokens))
    merged = lm.merge(states, own_logit_bias=bias, position_offset=L)
    t_enc = time.perf_counter() - t0
    scores = _loop(items, progress, lambda item: score_after(lm, merged, item, options.scoring, options.test_prefix))
    info = {
        "groups": [{"demo_ids": g.demo_ids, "tokens": len(g.tokens), "truncated_tokens": g.truncated_tokens,
                    "padded_tokens": g.padded_tokens} for g in groups],
        "n_groups": len(groups), "group_length": L, "own_logit_bias": bias, "align": options.align,
        "demos_used": [sum(len(g.demo_ids) for g in groups)] * len(items),
        "cache_bytes": lm.nbytes(merged), "cache_reuse": True,
    }
    return MethodResult(scores, _timed(info, t0, t_enc, len(items)))


def structured(lm, prompt, demos, items, options: MethodOptions, progress: Progress = None) -> MethodResult:
    """Structured Prompting (Hao et al. 2022): groups encoded independently, test rescaled by log M."""
    if not demos:
        return incremental(lm, prompt, demos, items, options, progress)
    groups = make_groups(prompt, demos, options)
    return _grouped(lm, prompt, Merge(groups, _rescale_bias(options, len(groups))), items, options, progress)


def saicl(lm, prompt, demos, items, options: MethodOptions, progress: Progress = None) -> MethodResult:
    """SAICL's decoder adaptation: one group per demonstration, all right-aligned to the test input."""
    if not demos:
        return incremental(lm, prompt, demos, items, options, progress)
    groups = make_groups(prompt, demos, options, one_per_demo=True)
    bias = math.log(len(groups)) if options.saicl_rescale else 0.0
    return _grouped(lm, prompt, Merge(groups, bias), items, options, progress)


def ensemble(lm, prompt, demos, items, options: MethodOptions, progress: Progress = None) -> MethodResult:
    """Each demonstration (or each of `n_groups` groups) alone as the context; scores averaged over groups."""
    if not demos:
        return incremental(lm, prompt, demos, items, options, progress)
    t0 = time.perf_counter()
    groups = make_groups(prompt, demos, options, one_per_demo=not options.n_groups)
    room = _room(lm, _longest(items))
    if room is not None and max(len(g.tokens) for g in groups) > room:
        raise PromptTooLong("an ensemble group does not fit the window next to the test item; use more groups")
    states = [encode(lm, g.tokens, 0, options.segment_tokens) for g in groups]
    t_enc = time.perf_counter() - t0

    def one(item: TestItem) -> list[float]:
        if options.ensemble_reduce == "mean_logits":  # SAICL §5.3: average the logits of all groups, then score
            mean = torch.stack([_logits_after(lm, s, item) for s in states]).mean(0)
            return score_candidates(mean, item.candidates, options.scoring)
        per_group = np.array([score_after(lm, s, item, options.scoring, options.test_prefix) for s in states])  # (G, C)
        return reduce_scores(per_group, options.ensemble_reduce).tolist()

    scores = _loop(items, progress, one)
    info = {"n_groups": len(groups), "groups": [{"demo_ids": g.demo_ids, "tokens": len(g.tokens)} for g in groups],
            "demos_used": [len(demos)] * len(items), "reduce": options.ensemble_reduce,
            "cache_bytes": sum(lm.nbytes(s) for s in states), "cache_reuse": True}
    return MethodResult(scores, _timed(info, t0, t_enc, len(items)))


def _timed(info: dict, t0: float, t_encode: float, n_items: int) -> dict:
    total = time.perf_counter() - t0
    info.update(seconds=total, encode_seconds=t_encode, seconds_per_item=total / max(1, n_items),
                marginal_seconds_per_item=(total - t_encode) / max(1, n_items))
    return info


def fid(lm, prompt, demos, items, options: MethodOptions, progress: Progress = None) -> MethodResult:
    """Fusion-in-Decoder exists only on encoder-decoder models (dispatched below); 0 shots is `incremental`."""
    if not demos:
        return incremental(lm, prompt, demos, items, options, progress)
    raise ConfigError("fid needs an encoder-decoder model (--hf-model with a T5 folder)")


def _encoder_decoder_aware(name: str, method: Method) -> Method:
    """An encoder-decoder model (icl_eval/models/t5.py) runs the method's encoder-decoder form (icl_eval/methods/encoder_decoder.py)."""

    def dispatch(lm, prompt, demos, items, options: MethodOptions, progress: Progress = None) -> MethodResult:
        if getattr(lm, "encoder_decoder", False):
            if name not in ENCDEC_METHODS:
                raise ConfigError(f"method {name!r} has no encoder-decoder form; valid: {sorted(ENCDEC_METHODS)}")
            return ENCDEC_METHODS[name](lm, prompt, demos, items, options, progress)
        return method(lm, prompt, demos, items, options, progress)

    dispatch.__name__, dispatch.__doc__ = method.__name__, method.__doc__
    return dispatch


METHODS: dict[str, Method] = {name: _encoder_decoder_aware(name, fn) for name, fn in {
    "incremental": incremental,
    "concat": concat,
    "structured": structured,
    "saicl": saicl,
    "ensemble": ensemble,
    "fid": fid,
    "finetune": finetune,
}.items()}
