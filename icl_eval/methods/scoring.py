"""Candidate scoring, written once for every method (docs/evaluation.md), calibration and metrics.

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

from evalm.config_toolkit import ConfigError
from evalm.icl_eval.tasks.prompts import Candidate


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


def _first_logit(lp: Tensor, logits, cand: Candidate, rule: str) -> float:
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
        raise ConfigError(f"scoring rule {rule!r} is not known; valid: {sorted(RULES)}")
    width = logits.shape[1]
    tokens = torch.zeros((len(candidates), width), dtype=torch.long)
    for i, c in enumerate(candidates):
        tokens[i, : len(c.tokens)] = torch.tensor(c.tokens)
    lp = token_logprobs(logits, tokens)
    return [RULES[rule](lp[i], logits[i], c, rule) for i, c in enumerate(candidates)]


class _PrefixRows:
    """`logits[t, token]` of one candidate whose rows t < p are the shared prefix's and the rest its tail's."""

    def __init__(self, prefix: Tensor, tail: Tensor | None):
        self.prefix, self.tail = prefix, tail

    def __getitem__(self, index: tuple[int, int]) -> Tensor:
        t, token = index
        p = self.prefix.shape[0]
        return self.prefix[t, token] if t < p else self.tail[t - p, token]


def _log_softmax_wide(rows: Tensor) -> Tensor:
    return torch.log_softmax(rows.to(torch.promote_types(rows.dtype, torch.float32)), dim=-1)


def _pick(logp: Tensor, targets: Sequence[int]) -> Tensor:
    return logp.gather(-1, torch.tensor(list(targets), dtype=torch.long, device=logp.device)[:, None]).squeeze(-1)


def score_after_prefix(prefix_logits: Tensor, tail_logits: Tensor | None, candidates: Sequence[Candidate],
                       rule: str) -> list[float]:
    """Scores of candidates that share their first p tokens, from the logits of those p tokens (p, V),
    computed once, and of each candidate's tokens [p, len - 1) (C, S, V), right-padded (None when no
    candidate has any: single-token answers at the end are scored from the prefix's forward alone).

    Row t predicts token t + 1 and log-softmax is row-wise, so these are `score_candidates`' numbers
    row for row; a candidate's last token predicts nothing and is never fed."""
    if rule not in RULES:
        raise ConfigError(f"scoring rule {rule!r} is not known; valid: {sorted(RULES)}")
    p = prefix_logits.shape[0]
    prefix_lp = _log_softmax_wide(prefix_logits)  # (p, V), once for every candidate
    head = torch.cat([prefix_lp.new_zeros(1), _pick(prefix_lp[:-1], candidates[0].tokens[1:p])]) if p else None
    out = []
    for i, c in enumerate(candidates):
        parts = [head, _pick(prefix_lp[-1:], c.tokens[p : p + 1])] if p else [prefix_lp.new_zeros(1)]
        n_tail = len(c.tokens) - 1 - p
        tail = tail_logits[i, :n_tail] if n_tail > 0 else None
        if tail is not None:
            parts.append(_pick(_log_softmax_wide(tail), c.tokens[p + 1 :]).to(prefix_lp.dtype))
        out.append(RULES[rule](torch.cat(parts), _PrefixRows(prefix_logits, tail), c, rule))
    return out


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
        raise ConfigError(f"calibration {mode!r} is not known; valid: {sorted(CALIBRATIONS)}")
    fn = CALIBRATIONS[mode]
    return scores if fn is None else fn(np.asarray(scores, dtype=np.float64), np.asarray(cf, dtype=np.float64))


def macro_f1(pred: np.ndarray, true: np.ndarray) -> float:
    """The mean over every label predicted or gold of its F1 = 2 tp / (gold + predicted): scikit-learn's
    `f1_score(average="macro")`, the same floats, without importing scikit-learn (a second) in every
    evaluation process."""
    labels = np.union1d(true, pred)
    is_pred, is_true = pred[:, None] == labels, true[:, None] == labels  # (items, labels)
    tp = (is_pred & is_true).sum(axis=0).astype(np.float64)
    return float(np.mean(2.0 * tp / (is_true.sum(axis=0).astype(np.float64) + is_pred.sum(axis=0))))


def metrics(predictions: Sequence[int], gold: Sequence[int]) -> dict[str, float]:
    """Accuracy and macro-F1 over the items with a known gold label."""
    pairs = [(p, g) for p, g in zip(predictions, gold) if g >= 0]
    if not pairs:
        return {"accuracy": float("nan"), "macro_f1": float("nan"), "n": 0}
    pred, true = (np.array(x) for x in zip(*pairs))
    acc = float(np.mean(pred == true))
    return {"accuracy": acc, "macro_f1": macro_f1(pred, true), "n": len(pairs)}
