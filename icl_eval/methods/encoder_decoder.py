"""The ICL methods on an encoder-decoder model (SAICL §3-4, Appendix D), one signature with `methods.py`.

    method(lm: T5LM, prompt, demos, items, options) -> MethodResult

The prompt is split at the label slot (MetaICL's *direct* form, SAICL §4.1): the encoder reads
the demonstrations and the test input, the decoder scores the rest of the instance from the label
on, so the candidates are scored by the decoder with the project's one scoring function:

    demo segment  d_i = I(x_i, y_i) sep                 (what every method puts in the encoder)
    test segment  t   = [instruction] pre(x) </s>       (the template's text before {label})
    decoder       [start] answer(y) post(x) </s>        (scored: `answer-*` the answer, `instance-*` all)

| method   | encoder                                             | decoder                      | oracle                   |
|----------|-----------------------------------------------------|------------------------------|--------------------------|
| concat   | stock, full attention over d_1 ... d_k t            | once                         | -                        |
| saicl    | structured (App. B), per-segment relative positions | once                         | == explicit-mask T5; perm.-invariant; k=1 == concat (aligned) |
| fid      | stock, each (d_i, t) alone; outputs concatenated    | once, over all pairs         | == pairs encoded one by one |
| ensemble | stock, each (d_i, t) alone                          | once per pair; scores reduced | -                       |

SAICL's demonstrations attend to the test, so nothing is cached across test items: every method
re-encodes per item (the paper's setting and its timing, Fig. 2). With no demonstrations every
method is the encoder over t alone.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from evalm.icl_eval.models.lm import right_pad
from evalm.icl_eval.methods.options import MethodOptions, MethodResult, Progress, reduce_scores
from evalm.icl_eval.tasks.prompts import Candidate, Demo, PromptBuilder, TestItem
from evalm.icl_eval.methods.scoring import score_candidates

Segment = tuple[int, ...]


def demo_segments(prompt: PromptBuilder, demos: Sequence[Demo]) -> list[Segment]:
    """d_i = I(x_i, y_i) sep: concatenated they are `concat`'s demonstration stream."""
    return [tuple(d.tokens) + tuple(prompt.sep) for d in demos]


def split_item(lm, prompt: PromptBuilder, item: TestItem) -> list[tuple[Segment, Candidate]]:
    """Per candidate: the encoder's test segment and the decoder sequence with its scored spans."""
    out = []
    for c in item.candidates:
        test = tuple(prompt.instruction) + tuple(c.tokens[c.body_start:c.answer_start]) + (lm.eos_id,)
        target = tuple(c.tokens[c.answer_start:]) + (lm.eos_id,)
        n_answer = c.answer_end - c.answer_start
        out.append((test, Candidate((lm.start_id,) + target, 1, 1, 1 + n_answer)))
    return out


@torch.no_grad()
def _score(lm, hidden, mask, cands: list[Candidate], rule: str) -> list[float]:
    """Decoder scores of candidates over one prompt's encoder states (1, N, d)."""
    C = len(cands)
    logits = lm.decoder_logits(hidden.expand(C, *hidden.shape[1:]), mask.expand(C, -1),
                               right_pad([c.tokens for c in cands], lm.pad_id))
    return score_candidates(logits, cands, rule)


@torch.no_grad()
def _encoded(lm, kind: str, demos: list[Segment], options: MethodOptions, item_parts):
    """Scores of one item: the encoder runs once per distinct test segment (direct: once per item)."""
    scores: dict[int, float] = {}
    by_test: dict[Segment, list[int]] = {}
    for j, (test, _) in enumerate(item_parts):
        by_test.setdefault(test, []).append(j)
    for test, idx in by_test.items():
        hidden, mask = lm.encode(kind if demos else "full", [demos], [test], options.t5_cross)
        for j, s in zip(idx, _score(lm, hidden, mask, [item_parts[j][1] for j in idx], options.scoring)):
            scores[j] = s
    return [scores[j] for j in range(len(item_parts))]


def _encoding(kind: str):
    """The method that encodes every item's episode with the encoder `kind` (full, saicl, fid) and scores it."""

    def run(lm, prompt, demos, items, options: MethodOptions, progress: Progress) -> MethodResult:
        t0 = time.perf_counter()
        segs = demo_segments(prompt, demos)
        scores = []
        for item in items:
            scores.append(_encoded(lm, kind, segs, options, split_item(lm, prompt, item)))
            if progress:
                progress(1)
        info = {"demos_used": [len(segs)] * len(items), "encoder": kind, "cache_reuse": False,
                "context_tokens": sum(map(len, segs)), "segment_tokens_max": max(map(len, segs), default=0)}
        if kind == "saicl":
            info["cross_positions"] = options.t5_cross
        return MethodResult(scores, _timed(info, t0, len(items)))

    return run


def concat(lm, prompt, demos, items, options: MethodOptions, progress: Progress = None) -> MethodResult:
    """The T5 baseline: full encoder attention over the demonstrations and the test input."""
    return _encoding("full")(lm, prompt, demos, items, options, progress)


def saicl(lm, prompt, demos, items, options: MethodOptions, progress: Progress = None) -> MethodResult:
    """SAICL: the structured encoder of §3.2 / Appendix B."""
    return _encoding("saicl")(lm, prompt, demos, items, options, progress)


def fid(lm, prompt, demos, items, options: MethodOptions, progress: Progress = None) -> MethodResult:
    """Fusion-in-Decoder (Izacard & Grave 2021, SAICL §4.2): pairs encoded alone, fused by cross-attention."""
    return _encoding("fid")(lm, prompt, demos, items, options, progress)


@torch.no_grad()
def ensemble(lm, prompt, demos, items, options: MethodOptions, progress: Progress = None) -> MethodResult:
    """Each (d_i, t) pair decoded alone, scores reduced over pairs (Min et al. 2022a; SAICL App. D.1)."""
    if not demos:
        return concat(lm, prompt, demos, items, options, progress)
    t0 = time.perf_counter()
    segs = demo_segments(prompt, demos)
    scores = []
    for item in items:
        mean_logits = options.ensemble_reduce == "mean_logits"
        per_pair = _pair_scores(lm, segs, split_item(lm, prompt, item), options.scoring, mean_logits)  # (k or 1, C)
        scores.append((per_pair[0] if mean_logits else reduce_scores(per_pair, options.ensemble_reduce)).tolist())
        if progress:
            progress(1)
    info = {"demos_used": [len(segs)] * len(items), "encoder": "pairs", "n_groups": len(segs),
            "reduce": options.ensemble_reduce, "cache_reuse": False}
    return MethodResult(scores, _timed(info, t0, len(items)))


def _pair_scores(lm, segs: list[Segment], parts, rule: str, mean_logits: bool = False) -> np.ndarray:
    """(k, C) scores of every candidate after every (d_i, t) pair alone: one batched encoder and decoder call
    per distinct test segment. `mean_logits`: (1, C), the pairs' decoder logits averaged, then scored (SAICL §5.3)."""
    out = np.zeros((1 if mean_logits else len(segs), len(parts)))
    by_test: dict[Segment, list[int]] = {}
    for j, (test, _) in enumerate(parts):
        by_test.setdefault(test, []).append(j)
    for test, idx in by_test.items():
        hidden, mask = lm.encode("full", [[s] for s in segs], [test] * len(segs))  # (k, Lp, d)
        cands = [parts[j][1] for j in idx]
        C = len(cands)
        tiled = [c for _ in segs for c in cands]  # pair-major, as repeat_interleave
        logits = lm.decoder_logits(hidden.repeat_interleave(C, 0), mask.repeat_interleave(C, 0),
                                   right_pad([c.tokens for c in tiled], lm.pad_id))
        if mean_logits:
            out[0, idx] = score_candidates(logits.reshape(len(segs), C, *logits.shape[1:]).mean(0), cands, rule)
            continue
        flat = score_candidates(logits, tiled, rule)
        out[:, idx] = np.array(flat).reshape(len(segs), C)
    return out


def _timed(info: dict, t0: float, n_items: int) -> dict:
    total = time.perf_counter() - t0
    info.update(seconds=total, encode_seconds=0.0, seconds_per_item=total / max(1, n_items))
    return info


ENCDEC_METHODS = {"concat": concat, "saicl": saicl, "fid": fid, "ensemble": ensemble}
