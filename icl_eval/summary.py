"""The protocol's records summarised: every accuracy beside its baselines and intervals (ICL_SPEC §5).

Per split, method and shot count (a cell): mean ± std over seeds of accuracy, macro-F1, seconds
per item and demonstrations used (as before), plus
- `accuracy_ci95`: the hierarchical bootstrap interval over seeds and items (`bootstrap.py`);
- `baselines`: chance, test-set majority and in-context majority on the same items and
  demonstrations, each with its own interval (`baselines.py`);
- `gain`: accuracy minus the best baseline (the one with the highest mean), paired item by item;
- `vs_0_shots` and `vs_<method>`: paired differences against the same method at 0 shots and
  against the first method of the run at the same shots.
The headline of a report is `gain`, never a raw accuracy alone. `best_shot` picks the shot with
the best validation accuracy per method (EVALM §4.1) and reports test accuracy there.
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from evalm.icl_eval.baselines import NAMES as BASELINES
from evalm.icl_eval.bootstrap import hierarchical_interval, interval_summary

AVERAGED = ("accuracy", "macro_f1", "seconds_per_item", "demos_used_mean")


def _by_seed(rows: list[dict], key: str) -> tuple[list[np.ndarray], list[list[tuple[int, int]]]]:
    """Per seed: the vector under `key` and its items, named (item set, index) so that seeds with
    their own items (a fresh synthetic episode each) never look like seeds sharing items."""
    rows = sorted(rows, key=lambda r: r["seed"])
    return ([np.asarray(r[key], dtype=float) for r in rows],
            [[(r.get("item_set", 0), i) for i in r["item_ids"]] for r in rows])


def _paired(a: list[dict], b: list[dict], key_a: str, key_b: str) -> dict[str, Any]:
    """Mean and interval of a - b over the same seeds and items."""
    va, ids = _by_seed(a, key_a)
    vb, ids_b = _by_seed(b, key_b)
    if ids != ids_b:
        raise ValueError("a paired comparison needs the same seeds and items on both sides")
    diff = [x - y for x, y in zip(va, vb)]
    lo, hi = hierarchical_interval(diff, ids)
    return {"mean": float(np.mean([d.mean() for d in diff])), "ci95": [lo, hi]}


def _cell(rows: list[dict], base_rows: list[dict]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in AVERAGED:
        values = [r[key] for r in rows]
        out[f"{key}_mean"] = float(statistics.fmean(values))
        out[f"{key}_std"] = float(statistics.stdev(values)) if len(values) > 1 else 0.0
    out["n_seeds"] = len(rows)
    out["n_items"] = len(rows[0]["item_ids"])
    values, ids = _by_seed(rows, "correct")
    out["accuracy_ci95"] = list(hierarchical_interval(values, ids))
    out["baselines"] = {name: interval_summary(*_by_seed(base_rows, name)) for name in BASELINES}
    best = max(BASELINES, key=lambda name: out["baselines"][name]["mean"])
    out["gain"] = {"over": best, **_paired(rows, base_rows, "correct", best)}
    return out


def summarize(records: list[dict], baselines: list[dict]) -> dict[str, Any]:
    """{split: {method: {shots: cell}}}, plus `best_shot` when a validation split was scored."""
    out: dict[str, Any] = {}
    methods = list(dict.fromkeys(r["method"] for r in records))
    for split in ("test", "validation"):
        rows = [r for r in records if r["split"] == split]
        if not rows:
            continue
        table: dict[str, dict[str, Any]] = {}
        for method in methods:
            for k in sorted({r["shots"] for r in rows if r["method"] == method}):
                cell_rows = [r for r in rows if r["method"] == method and r["shots"] == k]
                base = [b for b in baselines if b["split"] == split and b["shots"] == k]
                cell = _cell(cell_rows, base)
                zero = [r for r in rows if r["method"] == method and r["shots"] == 0]
                if k and zero:
                    cell["vs_0_shots"] = _paired(cell_rows, zero, "correct", "correct")
                ref = [r for r in rows if r["method"] == methods[0] and r["shots"] == k]
                if method != methods[0] and ref:
                    cell[f"vs_{methods[0]}"] = _paired(cell_rows, ref, "correct", "correct")
                table.setdefault(method, {})[str(k)] = cell
        out[split] = table
    if "validation" in out:
        out["best_shot"] = _best_shot(out)
    return out


def _best_shot(out: dict[str, Any]) -> dict[str, Any]:
    best = {}
    for m, shots in out["validation"].items():
        k = max(shots, key=lambda s: (shots[s]["accuracy_mean"], -int(s)))
        test = out["test"][m][k]
        best[m] = {"best_shot": int(k), "validation_accuracy": shots[k]["accuracy_mean"],
                   "test_accuracy": test["accuracy_mean"], "test_accuracy_std": test["accuracy_std"],
                   "test_accuracy_ci95": test["accuracy_ci95"], "test_gain": test["gain"]}
    return best
