"""Blending: per-subset token budgets -> which documents (and how many copies) go where.

EVALM Appendix A.1 / Table 5 and docs/data_pipeline.md. For each subset with budget T and available
tokens A, epochs e = T / A. Every document is taken floor(e) times, then a seeded shuffle of the
subset's documents is taken in order until the fractional part's tokens are reached; with
overflow = "cap", e is at most 1. All copies are shuffled together with the seed and cut into
equal shards, so every shard (and every training batch) mixes the subsets in proportion.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from evalm.config_toolkit import ConfigError
from evalm.data_pipeline.config import Budgets


def estimate_tokens(text: str, bytes_per_token: float) -> int:
    """Tokens before tokenisation: UTF-8 bytes / bytes per token, at least 1."""
    return max(1, math.ceil(len(text.encode("utf-8")) / bytes_per_token))


def targets(budgets: Budgets, available: dict[str, int]) -> dict[str, float]:
    """Target tokens per budgeted subset (absolute, or relative scaled to the data)."""
    if not budgets.relative:
        return {s: v * budgets.unit * budgets.scale for s, v in budgets.tokens.items()}
    # Proportions among the budgeted subsets the data has: a subset absent from the input (say
    # Books3 in a corpus without it) must not shrink the blend to nothing; its target stays 0.
    present = {s: v for s, v in budgets.tokens.items() if v > 0 and available.get(s, 0) > 0}
    total = sum(present.values())
    shares = {s: v / total for s, v in present.items()}
    # the largest blend in these proportions that repeats no subset
    size = min((available[s] / share for s, share in shares.items()), default=0.0)
    return {s: shares.get(s, 0.0) * size for s in budgets.tokens}


@dataclass(frozen=True)
class Plan:
    copies: np.ndarray
    """Dense document ids of the blend, in output order (a document repeats once per epoch)."""
    report: dict[str, dict[str, float]]
    """Per subset: target, available and actual tokens, epochs."""


def plan(subsets: Sequence[str], tokens: Sequence[int], budgets: Budgets, seed: int) -> Plan:
    """Choose the copies of each document and their shuffled order."""
    rng = np.random.default_rng(seed)
    tokens_arr = np.asarray(tokens, dtype=np.int64)
    by_subset: dict[str, list[int]] = {}
    for i, s in enumerate(subsets):
        by_subset.setdefault(s, []).append(i)
    available = {s: int(tokens_arr[idx].sum()) for s, idx in by_subset.items()}
    goal = targets(budgets, available)
    chosen, report = [], {}
    for subset in sorted(goal):
        idx = np.asarray(by_subset.get(subset, []), dtype=np.int64)
        have = available.get(subset, 0)
        epochs = goal[subset] / have if have else 0.0
        if budgets.overflow == "cap":
            epochs = min(epochs, 1.0)
        _check_epochs(subset, goal[subset], have, len(idx), epochs, budgets.max_epochs)
        whole = int(epochs)
        picked = [np.repeat(idx, whole)] if whole else []
        order = idx[rng.permutation(len(idx))]
        need = (epochs - whole) * have
        if need > 0 and len(order):
            cum = np.cumsum(tokens_arr[order])
            picked.append(order[: int(np.searchsorted(cum, need)) + 1])
        got = np.concatenate(picked) if picked else np.empty(0, dtype=np.int64)
        chosen.append(got)
        actual = int(tokens_arr[got].sum())
        report[subset] = {
            "target_tokens": goal[subset],
            "available_tokens": have,
            "actual_tokens": actual,
            "epochs": actual / have if have else 0.0,
        }
    unbudgeted = sorted(set(available) - set(goal))
    for subset in unbudgeted:  # present in the data, absent from the budgets: dropped, recorded
        report[subset] = {"target_tokens": 0.0, "available_tokens": available[subset], "actual_tokens": 0, "epochs": 0.0}
    copies = np.concatenate(chosen) if chosen else np.empty(0, dtype=np.int64)
    if len(copies) == 0 and len(tokens_arr):
        raise ConfigError(f"the budgets select no document from {len(tokens_arr)} available "
                          f"(available tokens per subset: {available}); check the budgets file's [tokens] names and scale")
    return Plan(copies=copies[rng.permutation(len(copies))], report=report)


def _check_epochs(subset: str, goal: float, have: int, documents: int, epochs: float, max_epochs: float) -> None:
    """Refuse a repeat factor past `max_epochs` before any copy is made: Table 5's billions of tokens over
    a few dozen sample documents are millions of copies of each (a MemoryError while planning, or a
    blend that is a handful of documents on repeat)."""
    if epochs > max_epochs:
        raise ConfigError(
            f"--budgets: subset {subset!r} would repeat each of its {documents} documents {epochs:,.0f} times "
            f"({goal:,.0f} tokens wanted, {have:,} available), more than max_epochs = {max_epochs:g}; for data "
            "this small set relative = true in the budgets file (Table 5's proportions at the size the data "
            "allows), or lower scale, or overflow = \"cap\"")


def shard_of(position: np.ndarray, n_copies: int, shards: int) -> np.ndarray:
    """Equal contiguous cuts of the shuffled order: copy at position p goes to shard p*K // n."""
    return (position * shards) // max(n_copies, 1)
