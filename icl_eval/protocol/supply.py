"""Can the data supply what was asked? Checked before any scoring, never capped silently.

A shot count above the training pool, more test items than the test split, a `--max-tokens` that
disagrees with the largest `--lengths` bucket, or a bucket no book reaches is an error that names
what is missing and what to do. With `--allow-skip` the shortfall is dropped from the run and
recorded in results.json under `skipped` instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from evalm.config_toolkit import ConfigError

SKIP_HINT = "or pass --allow-skip to record it as skipped in results.json"


def icl_supply(config, splits: dict, allow_skip: bool) -> tuple[Any, list[dict]]:
    """`icl_grid` for the splits of the first seed: the validation split the shot count is chosen on
    is the task's own, else `validation_items` held out of train (icl_eval.protocol.cells.hold_out_validation)."""
    n_train, n_test = len(splits["train"]), len(splits["test"])
    if not config.choose_shot_on_validation:
        return icl_grid(config, n_train, 0, n_test, allow_skip)
    own = len(splits.get("validation") or ())
    held = 0 if own else config.validation_items
    return icl_grid(config, n_train, held, n_test, allow_skip, own or held)


def icl_grid(config, n_train: int, held_out: int, n_test: int, allow_skip: bool,
             n_validation: int | None = None) -> tuple[Any, list[dict]]:
    """The EvalConfig with what the splits cannot supply removed (allow_skip) or an error.

    `n_validation`: items of the split the shot count is chosen on (choose_shot_on_validation),
    which the same --test-items sample is drawn from."""
    skipped: list[dict] = []
    pool = n_train - held_out
    shots = [] if config.budgets else config.shots  # a budget grid takes what fits; `fit` says when nothing does
    demonstrated = [k for k in shots if k]
    if config.nearest and demonstrated:
        fewest, k = min(demonstrated), config.nearest_k
        if k > fewest or ("remove" in config.nearest and k == fewest):
            raise ConfigError(f"--nearest-k {k}: " + (f"more than the {fewest} demonstrations of --shots {fewest}"
                              if k > fewest else f"removing all {fewest} demonstrations of --shots {fewest} leaves none")
                              + "; lower --nearest-k or drop the smaller shot counts")
    too_many = [k for k in shots if k > pool]
    if too_many:
        why = (f"--shots {','.join(map(str, too_many))}: the train split has {n_train} items"
               + (f" ({held_out} held out for validation)" if held_out else "") + f", so at most {pool} demonstrations")
        if not allow_skip:
            raise ConfigError(f"{why}; lower --shots or give a larger train split, {SKIP_HINT}")
        if len(too_many) == len(config.shots):
            raise ConfigError(f"{why}; no shot count is left to run: lower --shots")
        skipped += [{"shots": k, "why": why} for k in too_many]
        config = dataclasses.replace(config, shots=tuple(k for k in config.shots if k <= pool))
    if config.test_items is not None and config.test_items > n_test:
        why = f"--test-items {config.test_items}: the test split has {n_test} items"
        if not allow_skip:
            raise ConfigError(f"{why}; lower --test-items or leave it out to score the whole split, {SKIP_HINT}")
        skipped.append({"test_items": config.test_items, "why": f"{why}; scored all {n_test}"})
        config = dataclasses.replace(config, test_items=None)
    if n_validation is not None and config.test_items is not None and config.test_items > n_validation:
        why = (f"--test-items {config.test_items}: the validation split the shot count is chosen on has "
               f"{n_validation} items")
        if not allow_skip:
            raise ConfigError(f"{why}; lower --test-items (or raise eval.validation_items), {SKIP_HINT}")
        skipped.append({"validation_items": n_validation, "why": f"{why}; scored all {n_validation} there"})
    return config, skipped


def ppl_lengths(buckets: tuple[int, ...], max_tokens: int | None, max_tokens_flag: str) -> int:
    """The tokens to score per book: the largest bucket; a `max_tokens` that disagrees is an error."""
    if list(buckets) != sorted(set(buckets)) or not buckets or buckets[0] < 1:
        raise ConfigError(f"--lengths {','.join(map(str, buckets))}: give increasing positive bucket ends")
    top = buckets[-1]
    if max_tokens is None or max_tokens == top:
        return top
    if max_tokens < top:
        raise ConfigError(f"{max_tokens_flag} {max_tokens} is below the largest --lengths bucket {top}: tokens past "
                          f"{max_tokens} would never be scored; raise it to {top} or drop the larger buckets")
    raise ConfigError(f"{max_tokens_flag} {max_tokens} is above the largest --lengths bucket {top}: tokens past "
                      f"{top} would be scored in no bucket; add {max_tokens} to --lengths or lower {max_tokens_flag}")


def ppl_reach(books: Iterable[tuple[str, str]], encode: Callable[[str], list[int]], buckets: tuple[int, ...],
              fixed_need: int, allow_skip: bool) -> list[dict]:
    """Reads books until one holds every requested length; the skips (allow_skip) or an error.

    A pass over the books that only tokenizes (one book in memory at a time): an unreachable
    bucket is known before hours of scoring, not after."""
    need = max(buckets[-1], fixed_need)
    longest, name = 0, None
    for title, text in books:
        n = len(encode(text))
        if n > longest:
            longest, name = n, title
        if longest >= need:
            return []
    missing = [b for b in buckets if b > longest]
    parts = []
    if missing:
        parts.append(f"--lengths bucket(s) {','.join(map(str, missing))}")
    if fixed_need > longest:
        parts.append(f"--fixed-contexts (the longest context plus ppl.fixed_target_tokens = {fixed_need} tokens)")
    why = f"no book reaches {' and '.join(parts)}: the longest, {name!r}, has {longest} tokens"
    if not allow_skip or fixed_need > longest or len(missing) == len(buckets):
        raise ConfigError(f"{why}; give longer books or lower the lengths" + ("" if fixed_need > longest else f", {SKIP_HINT}"))
    return [{"bucket": b, "why": why} for b in missing]
