"""What `evalm eval recall` writes: results.json (cells, cost, records), predictions.jsonl, one line per cell."""

from __future__ import annotations

from pathlib import Path

from evalm.icl_eval.recall import families
from evalm.icl_eval.recall.runner import cells, cost_rows, item_rng


def results(metas: list[dict], config, header: dict) -> dict:
    """The merged units (in the grid's order) as results.json's content, `header` first."""
    records = [r for m in metas for r in m["records"]]
    rates = {}
    for task in config.tasks:
        spec = families.spec(task, item_rng(task, config.seeds[0], 0, "spec"), config)
        rates[task] = (spec.chance, spec.context_guess)  # the same for every item of a task
    ablation = {"eva_ablation": config.eva_ablation}  # every cell and record says which EVA it scored
    return {"command": "recall", **header, "cells": [{**c, **ablation} for c in cells(records, config, rates)],
            "cost": cost_rows([c for m in metas for c in m["cost"]], config),
            "records": [{**{k: v for k, v in r.items() if k != "generated"}, **ablation} for r in records]}


def write(out: Path, data: dict, metas: list[dict], config) -> None:
    from evalm.icl_eval.report import write_json, write_predictions

    write_json(out / "results.json", data)
    if config.save_predictions:
        write_predictions(out / "predictions.jsonl", [r for m in metas for r in m["records"]])
    for line in table(data):
        print(line)
    print(f"wrote {out}/results.json")


def table(data: dict) -> list[str]:
    """Per task and length: accuracy [95% interval] at each depth, the chance rate and the cost per item."""
    lines, cost = [], {(c["task"], c["length"]): c for c in data["cost"]}
    for (task, length), row in cost.items():
        cells_ = [c for c in data["cells"] if (c["task"], c["length"]) == (task, length)]
        accs = "  ".join(f"{c['depth']}%:{c['accuracy']:.2f} [{c['ci95'][0]:.2f}, {c['ci95'][1]:.2f}]" for c in cells_)
        lines.append(f"{task:>17} {length:>7,} tok  {accs}  (chance {cells_[0]['chance']:.2g}, "
                     f"{row['seconds_per_item']:.2f} s/item, {row['tokens_encoded_per_item']:,.0f} of "
                     f"{row['tokens_prompted_per_item']:,.0f} prompt tokens encoded)")
    return lines
