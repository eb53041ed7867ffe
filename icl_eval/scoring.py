"""Candidate scoring, written once for every method (ICL_SPEC §2), calibration and metrics.

A method hands over the logits of the test tokens `lead I(x, y)` for every candidate; the logit at
index t predicts token t + 1. The rules (one dict, `RULES`):

| rule            | score(y)                                                      | source                     |
|-----------------|---------------------------------------------------------------|----------------------------|
| instance-sum    | Σ log p over every token of I(x, y) (default)                 | EVALM Eq. 2                |
| instance-mean   | the same, divided by the number of tokens                     | length-normalised          |
| answer-sum      | Σ log p over the answer's tokens                              | answer-only                |
| answer-mean     | mean log p over the answer's tokens                           | Structured Prompting (MC)  |
| answer-logit    | raw next-token logit of the answer's first token              | Structured Prompting (cls) |

Whole-instance scoring is what makes label-first templates ("{Label} Movie Review: ...") work:
the answer's own log p is then conditioned on nothing of x, and the rest of I(x, y) carries x.

Calibration (`CALIBRATIONS`): `contextual` (Zhao et al. 2021: divide the label probabilities by
their mean over the three content-free inputs) and `pmi` (subtract the score after "N/A").
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from icl_eval.prompts import Candidate


def token_logprobs(logits: Tensor, tokens: Tensor) -> Tensor:
    """(B, T, V), (B, T) -> (B, T): log p(tokens[t] | < t) at t >= 1; index 0 is 0 (no prediction)."""
    wide = torch.promote_types(logits.dtype, torch.float32)  # float32, or float64 when given
    logp = torch.log_softmax(logits[:, :-1].to(wide), dim=-1)
    picked = logp.gather(-1, tokens[:, 1:, None].to(logp.device)).squeeze(-1)
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)


def _span(cand: Candidate, rule: str) -> tuple[int, int]:
    return (cand.body_start, len(cand.tokens)) if rule.startswith("instance") else (cand.answer_start, cand.answer_end)


def _sum(lp: Tensor, logits: Tensor, cand: Candidate, rule: str) -> float:
    a, b = _span(cand, rule)
    return float(lp[a:b].sum())


def _mean(lp: Tensor, logits: Tensor, cand: Candidate, rule: str) -> float:
    a, b = _span(cand, rule)
    return float(lp[a:b].mean())


def _first_logit(lp: Tensor, logits: Tensor, cand: Candidate, rule: str) -> float:
    return float(logits[cand.answer_start - 1, cand.tokens[cand.answer_start]])


RULES = {
    "instance-sum": _sum,
    "instance-mean": _mean,
    "answer-sum": _sum,
    "answer-mean": _mean,
    "answer-logit": _first_logit,
}


def score_candidates(logits: Tensor, candidates: Sequence[Candidate], rule: str) -> list[float]:
    """Scores of candidates fed as one right-padded batch: logits (C, T, V) aligned with their tokens."""
    if rule not in RULES:
        raise ValueError(f"scoring rule {rule!r} is not known; valid: {sorted(RULES)}")
    width = logits.shape[1]
    tokens = torch.zeros((len(candidates), width), dtype=torch.long)
    for i, c in enumerate(candidates):
        tokens[i, : len(c.tokens)] = torch.tensor(c.tokens)
    lp = token_logprobs(logits, tokens)
    return [RULES[rule](lp[i], logits[i], c, rule) for i, c in enumerate(candidates)]


# ----------------------------------------------------------------------------------------------
# Calibration: scores (N, C) of the test items, cf (K, C) of the same candidates after content-free inputs.

def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _contextual(scores: np.ndarray, cf: np.ndarray) -> np.ndarray:
    mean_p = np.exp(_log_softmax(cf)).mean(axis=0)  # (C,) Zhao et al.'s p_cf over the content-free inputs
    return _log_softmax(scores) - np.log(mean_p)


def _pmi(scores: np.ndarray, cf: np.ndarray) -> np.ndarray:
    return scores - cf[0]  # cf[0] is the "N/A" input (prompts.CONTENT_FREE)


CALIBRATIONS = {"none": None, "contextual": _contextual, "pmi": _pmi}


def calibrate(scores: np.ndarray, cf: np.ndarray | None, mode: str) -> np.ndarray:
    if mode not in CALIBRATIONS:
        raise ValueError(f"calibration {mode!r} is not known; valid: {sorted(CALIBRATIONS)}")
    fn = CALIBRATIONS[mode]
    return scores if fn is None else fn(np.asarray(scores, dtype=np.float64), np.asarray(cf, dtype=np.float64))


def metrics(predictions: Sequence[int], gold: Sequence[int]) -> dict[str, float]:
    """Accuracy and macro-F1 over the items with a known gold label."""
    from sklearn.metrics import f1_score

    pairs = [(p, g) for p, g in zip(predictions, gold) if g >= 0]
    if not pairs:
        return {"accuracy": float("nan"), "macro_f1": float("nan"), "n": 0}
    pred, true = zip(*pairs)
    acc = float(np.mean(np.array(pred) == np.array(true)))
    return {"accuracy": acc, "macro_f1": float(f1_score(true, pred, average="macro")), "n": len(pairs)}
