"""The protocol's records summarised: every accuracy beside its baselines and intervals (docs/evaluation.md).

Per split, method and shot count (a cell): mean ± std over seeds of accuracy, macro-F1, seconds
per item and demonstrations used (as before), plus
- `accuracy_ci95`: the hierarchical bootstrap interval over seeds and items (`bootstrap.py`);
- `baselines`: chance, test-set majority and in-context majority on the same items and
  demonstrations, each with its own interval (`baselines.py`);
- `gain`: accuracy minus the best baseline (the one with the highest mean), paired item by item;
- `vs_0_shots` and `vs_<method>`: paired differences against the same method at 0 shots and
  against the first method of the run at the same shots.
A cell is keyed by the grid's axis: `shots`, or `budget` for the token-budget protocol (then each
cell also gives the shots and prompt tokens each seed used; budget 0 is the 0-shot reference).
Runs of one draw in several orders (order seeds) are averaged per item within the draw before the
intervals, so the bootstrap resamples draws, not (draw, order) pairs as if independent; the cell
then gives `order_split` (`spread.py`). Arms scored on the same draws (another order,
`<method>+label-sorted`; a nearest-demonstration diagnostic, `<method>+remove-nearest`) are
cells of their own name with their own baselines (the in-context majority of the context they
showed) and `vs_base`: the paired difference to the same method on the same draws in the main
order with the full context; `remove-nearest` cells add the `sample_learning_ratio`, defined only
where the full context's gain over 0 shots is significant (else None and the reason).
The headline of a report is `gain`, never a raw accuracy alone. `best_shot` picks the shot with
the best validation accuracy per method (EVALM §4.1) and reports test accuracy there.
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from evalm.icl_eval.stats.baselines import NAMES as BASELINES
from evalm.icl_eval.stats.bootstrap import hierarchical_interval, interval_summary
from evalm.icl_eval.protocol.nearest import sample_learning_ratio
from evalm.icl_eval.stats.spread import order_split

AVERAGED = ("accuracy", "macro_f1", "seconds_per_item", "demos_used_mean")


def arm_name(record: dict) -> str:
    """The summary's name of a record's method and arm: `incremental`, `incremental+remove-nearest`."""
    return record["method"] + (f"+{record['arm']}" if record.get("arm") else "")


def _collapse(rows: list[dict]) -> list[dict]:
    """One row per draw seed: per-item correctness and the averaged statistics means over its orders."""
    by_seed: dict[int, list[dict]] = {}
    for r in rows:
        by_seed.setdefault(r["seed"], []).append(r)
    if all(len(g) == 1 for g in by_seed.values()):
        return rows
    out = []
    for group in by_seed.values():
        merged = dict(group[0])
        merged["correct"] = np.mean([g["correct"] for g in group], axis=0).tolist()
        for key in AVERAGED:
            merged[key] = float(statistics.fmean(g[key] for g in group))
        out.append(merged)
    return out


def _order_split(rows: list[dict]) -> dict[str, Any] | None:
    by_seed: dict[int, list[dict]] = {}
    for r in sorted(rows, key=lambda r: (r["seed"], r.get("order_seed") or 0)):
        by_seed.setdefault(r["seed"], []).append(r)
    if min(len(g) for g in by_seed.values()) < 2:
        return None
    return order_split([np.array([g["correct"] for g in group]) for group in by_seed.values()],
                       [[(group[0].get("item_set", 0), i) for i in group[0]["item_ids"]] for group in by_seed.values()])


def _by_seed(rows: list[dict], key: str) -> tuple[list[np.ndarray], list[list[tuple[int, int]]]]:
    """Per seed: the vector under `key` and its items, named (item set, index) so that seeds with
    their own items (a fresh synthetic episode each) never look like seeds sharing items."""
    rows = sorted(_collapse(rows) if key == "correct" else rows, key=lambda r: r["seed"])
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


def _cell(all_rows: list[dict], base_rows: list[dict]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    rows = _collapse(all_rows)
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
    split = _order_split(all_rows)
    if split:
        out["order_split"] = split
    if "budget" in rows[0]:
        out["shots_per_seed"] = [r["shots"] for r in sorted(rows, key=lambda r: r["seed"])]
        out["prompt_tokens_per_seed"] = [r["prompt_tokens"] for r in sorted(rows, key=lambda r: r["seed"])]
    return out


def summarize(records: list[dict], baselines: list[dict]) -> dict[str, Any]:
    """{split: {method[+arm]: {shots or budget: cell}}}, `axis`, and `best_shot` when a validation split was scored."""
    axis = "budget" if any("budget" in r for r in records) else "shots"
    out: dict[str, Any] = {"axis": axis}
    names = list(dict.fromkeys(arm_name(r) for r in records))
    first = next((n for n in names if "+" not in n), names[0] if names else "")
    for split in ("test", "validation"):
        rows = [r for r in records if r["split"] == split]
        if not rows:
            continue
        table: dict[str, dict[str, Any]] = {}
        for name in names:
            mine = [r for r in rows if arm_name(r) == name]
            method, arm = mine[0]["method"] if mine else name, mine[0].get("arm", "") if mine else ""
            main = [r for r in rows if r["method"] == method and not r.get("arm")]
            for k in sorted({r[axis] for r in mine}):
                cell_rows = [r for r in mine if r[axis] == k]
                base = [b for b in baselines if b["split"] == split and b.get(axis, b["shots"]) == k
                        and b.get("arm", "") == arm]
                cell = _cell(cell_rows, base)
                zero = [r for r in main if r[axis] == 0]
                if k and zero:
                    cell["vs_0_shots"] = _paired(cell_rows, zero, "correct", "correct")
                if arm:
                    ref = [r for r in main if r[axis] == k]
                    cell["vs_base"] = _paired(cell_rows, ref, "correct", "correct")
                    if arm == "remove-nearest" and zero:
                        cell.update(_learning_ratio(ref, cell_rows, zero))
                else:
                    ref = [r for r in rows if arm_name(r) == first and r[axis] == k]
                    if name != first and ref:
                        cell[f"vs_{first}"] = _paired(cell_rows, ref, "correct", "correct")
                table.setdefault(name, {})[str(k)] = cell
        out[split] = table
    if "validation" in out:
        out["best_shot"] = _best_shot(out)
    if any(r["method"] == "finetune" for r in records) and "test" in out:
        out["finetune_vs_icl"] = finetune_vs_icl(records, out["test"], axis)
    return out


def finetune_vs_icl(records: list[dict], table: dict[str, Any], axis: str) -> dict[str, Any]:
    """Fine-tuning on the N demonstrations beside in-context learning with them (the run's first ICL
    method), per N on the test split: both accuracies with their intervals and gains over the best label
    baseline, fine-tuning minus ICL paired on the same draws and items, what each cost, and per method
    the smallest N whose gain over the best baseline has its whole interval above 0."""
    rows = [r for r in records if r["split"] == "test" and not r.get("arm")]
    icl = next((m for m in dict.fromkeys(r["method"] for r in rows) if m != "finetune"), None)
    if icl is None:
        return {"icl_method": None, "why": "no in-context method in --methods to compare with"}
    per_n: dict[str, Any] = {}
    for k in sorted({r[axis] for r in rows if r["method"] == "finetune"}):
        ft = [r for r in rows if r["method"] == "finetune" and r[axis] == k]
        ic = [r for r in rows if r["method"] == icl and r[axis] == k]
        if ic:
            per_n[str(k)] = {"icl": _brief(table[icl][str(k)]), "finetune": _brief(table["finetune"][str(k)]),
                             "finetune_minus_icl": _paired(ft, ic, "correct", "correct"), "compute": _compute(ft, ic)}
    return {"icl_method": icl, "axis": axis, "per_n": per_n,
            "first_beats_best_baseline": {m: _first_beating(table[m]) for m in (icl, "finetune")}}


def finetune_lines(summary: dict[str, Any]) -> list[str]:
    """The side-by-side of `finetune_vs_icl` as the command line prints it: the paired difference per N,
    what each cost per N, and the first N above the best label baseline; nothing without fine-tuning."""
    side = summary.get("finetune_vs_icl") or {}
    if not side.get("icl_method"):
        return []
    icl, cells = side["icl_method"], side["per_n"].items()
    diff = "  ".join(f"{k}:{c['finetune_minus_icl']['mean']:+.3f} [{c['finetune_minus_icl']['ci95'][0]:+.2f}, "
                     f"{c['finetune_minus_icl']['ci95'][1]:+.2f}]" for k, c in cells)
    cost = "  ".join(f"{k}:{c['compute']['finetune']['train_flops'] / 1e9:.3g} vs {c['compute']['icl']['encode_flops'] / 1e9:.3g}"
                     for k, c in cells)
    first = ", ".join(f"{m} {n if n is not None else 'none'}" for m, n in side["first_beats_best_baseline"].items())
    return [f"finetune - {icl}  {diff}", f"GFLOPs, fine-tune vs encoding the {icl} prompt  {cost}",
            f"first N above the best label baseline (whole interval): {first}"]


def _brief(cell: dict[str, Any]) -> dict[str, Any]:
    return {"accuracy": cell["accuracy_mean"], "accuracy_ci95": cell["accuracy_ci95"], "gain": cell["gain"]}


def _first_beating(cells: dict[str, Any]) -> int | None:
    """The smallest N > 0 whose gain over the best label baseline is above 0 with its whole interval."""
    return next((int(k) for k in sorted(cells, key=int) if int(k) and cells[k]["gain"]["ci95"][0] > 0), None)


def _compute(ft: list[dict], ic: list[dict]) -> dict[str, Any]:
    """Means over the cell's records: the fine-tune's training cost against encoding the ICL prompt once
    (`2 x params x prompt tokens` FLOPs, the matmuls; attention's share left out), and each one's
    seconds per test item afterwards (the ICL item attends to the whole prompt, the tuned one to none)."""
    params = ft[0].get("n_params", 0)
    tokens = statistics.fmean(r.get("context_tokens", 0) for r in ic)
    return {"icl": {"prompt_tokens": tokens, "encode_seconds": statistics.fmean(r.get("encode_seconds", 0.0) for r in ic),
                    "encode_flops": 2.0 * params * tokens,
                    "seconds_per_item": statistics.fmean(r["seconds_per_item"] for r in ic)},
            "finetune": {key: statistics.fmean(r.get(key, 0) for r in ft) for key in
                         ("train_steps", "train_tokens", "train_seconds", "train_flops", "seconds_per_item")}}


def _learning_ratio(full: list[dict], removed: list[dict], zero: list[dict]) -> dict[str, Any]:
    """`sample_learning_ratio` of a remove-nearest cell, or None with the reason when the full
    context's gain over 0 shots is not significant (its paired interval reaches 0): a ratio over a
    gain that may be nil is noise (ManyICLBench reports it only for tasks that gain; SmolLM2's
    +0.003 [+0.000, +0.020] gave -5.00)."""
    gain = _paired(full, zero, "correct", "correct")
    if gain["ci95"][0] > 0:
        return {"sample_learning_ratio": sample_learning_ratio(_mean(full), _mean(removed), _mean(zero))}
    lo, hi = gain["ci95"]
    return {"sample_learning_ratio": None,
            "sample_learning_ratio_undefined": f"the full context's gain over 0 shots, {gain['mean']:+.3f} "
                                               f"[{lo:+.3f}, {hi:+.3f}], is not above zero: no gain to split"}


def _mean(rows: list[dict]) -> float:
    """Mean over draws of each draw's accuracy (orders averaged within a draw)."""
    return float(statistics.fmean(float(np.mean(r["correct"])) for r in _collapse(rows)))


def _best_shot(out: dict[str, Any]) -> dict[str, Any]:
    best = {}
    for m, shots in out["validation"].items():
        if m not in out["test"]:
            continue
        k = max(shots, key=lambda s: (shots[s]["accuracy_mean"], -int(s)))
        test = out["test"][m][k]
        best[m] = {"best_shot": int(k), "validation_accuracy": shots[k]["accuracy_mean"],
                   "test_accuracy": test["accuracy_mean"], "test_accuracy_std": test["accuracy_std"],
                   "test_accuracy_ci95": test["accuracy_ci95"], "test_gain": test["gain"]}
    return best
