"""Study tables: every markdown table of a study's or a run's result files, written here and nowhere else.

    evalm eval tables RESULTS_JSON...              # one run's table (`run_icl`, `run_ppl`), A+B+C pooled first
    evalm run --config STUDY --summary             # a study's [summary] tables (READERS, by its `reader`)
    evalm eval recall-tables --root runs/recall    # the recall study's tables (`recall_study`)

Per kind of result a row function that reads its command's file and gives the cells, spelled by the one
markdown writer (config_toolkit/markdown.py): nothing is loaded or computed but the table. A study report reads its
rows' files, so each `READERS` entry also returns the cells by row and column (the figures its goals name,
launcher/study_report.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from evalm.config_toolkit.markdown import markdown

Cells = dict[str, dict[str, float]]
"""A table's figures: row name -> column name -> value (what a study's goal reads)."""


def _fmt(value, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _ci(pair, signed: bool = False) -> str:
    f = "{:+.3f}" if signed else "{:.3f}"
    return "[" + ", ".join(f.format(x) for x in pair) + "]"


# ---------------------------------------------------------------- one run's results.json (`evalm eval tables`)

def _icl_cells(name: str, k: str, c: dict) -> list[str]:
    base = c["baselines"][c["gain"]["over"]]
    where = k + (f" ({'/'.join(map(str, c['shots_per_seed']))} shots, "
                 f"{'/'.join(map(str, c['prompt_tokens_per_seed']))} tokens)" if "shots_per_seed" in c else "")
    used = c.get("demos_used_mean_mean")
    if used is not None and "shots_per_seed" not in c and 0 < used < int(k) - 0.05:  # past the window: drop_left
        where += f" ({used:.1f} used)"
    d0, spread, arm, slr = c.get("vs_0_shots"), c.get("order_split"), c.get("vs_base"), c.get("sample_learning_ratio")
    return [name, where, f"{c['accuracy_mean']:.3f} {_ci(c['accuracy_ci95'])} ±{c['accuracy_std']:.3f}",
            f"{c['gain']['over']} {base['mean']:.3f} {_ci(base['ci95'])}",
            f"{c['gain']['mean']:+.3f} {_ci(c['gain']['ci95'], True)}",
            f"{d0['mean']:+.3f} {_ci(d0['ci95'], True)}" if d0 else "-",
            f"{spread['draw_std']:.3f} {_ci(spread['draw_std_ci95'])} / {spread['order_std']:.3f} "
            f"{_ci(spread['order_std_ci95'])}" if spread else "-",
            (f"{arm['mean']:+.3f} {_ci(arm['ci95'], True)}" if arm else "-")
            + (f"; SLR {slr:.2f}" if slr is not None else "; SLR undefined" if "sample_learning_ratio" in c else "")]


def run_icl(res: dict) -> str:
    """One `evalm eval icl` results.json: per arm and cell, accuracy [CI] ± draw std, the best label baseline,
    Δ vs 0 shots, the draw/order spread, and each arm's paired Δ to the main arm."""
    summary, ev = res["summary"], res["protocol"]["eval"]
    header = [f"{res['protocol']['task']} `--label-map {ev['label_map']}`", summary.get("axis", "shots"),
              "accuracy [95% CI] ± draw std", "best label baseline", "vs that baseline [CI]", "Δ vs 0 [CI]",
              "spread: draws / orders", "arm Δ vs main [CI]"]
    return markdown(header, [_icl_cells(name, k, c) for name, cells in summary["test"].items()
                             for k, c in sorted(cells.items(), key=lambda kv: int(kv[0]))])


def run_ppl(res: dict) -> str:
    """One `evalm eval ppl` results.json: token perplexity per bucket for each protocol and reference, then by
    a token's offset in its block where the run measured it (`--by-offset`)."""
    rows = {**res["protocols"], **res["references"]}
    edges = [tuple(b["bucket"]) for b in next(iter(rows.values()))["buckets"]]
    by_bucket = {name: {tuple(b["bucket"]): b["token_ppl"] for b in proto["buckets"]} for name, proto in rows.items()}
    lines = [markdown(["protocol", *(f"[{lo:,}, {hi:,})" for lo, hi in edges)],
                      [[name, *(f"{ppl[e]:.2f}" if e in ppl else "-" for e in edges)] for name, ppl in by_bucket.items()])]
    for name, found in ((n, p["block_offsets"]) for n, p in res["protocols"].items() if p.get("block_offsets")):
        lines += ["", f"{name}, by a token's offset in its block:", "",
                  markdown([f"[{r['offsets'][0]}, {r['offsets'][1]})" for r in found], [[f"{r['token_ppl']:.1f}" for r in found]])]
    return "\n".join(lines)


# ---------------------------------------------------------------- a study's rows (`[[summary.table]]` readers)

def study_ppl(found: dict[str, dict]) -> tuple[str, Cells]:
    """Token perplexity by position (the cache's protocol) per row, the references as rows below."""
    def buckets(entries) -> dict[str, float]:
        return {f"{b['bucket'][0]}-{b['bucket'][1]}": b["token_ppl"] for b in entries}

    cells = {m: buckets(r["protocols"]["cached"]["buckets"]) for m, r in found.items()}
    for name, ref in next(iter(found.values())).get("references", {}).items():  # the same book and buckets
        cells[f"({name})"] = buckets(ref["buckets"])
    columns = sorted({c for row in cells.values() for c in row}, key=lambda c: int(c.split("-")[0]))
    head = [f"[{int(a):,}, {int(b):,})" for a, b in (c.split("-") for c in columns)]
    return markdown(["model", *head], [[m, *(_fmt(row.get(c)) for c in columns)] for m, row in cells.items()]) + "\n", cells


def study_recall(found: dict[str, dict]) -> tuple[str, Cells]:
    """Exact-match recall per row, task and length, by needle depth, with chance."""
    rows = {m: r["cells"] for m, r in found.items()}
    depths = sorted({c["depth"] for cs in rows.values() for c in cs})
    lines = []
    for model, cs in rows.items():
        for task, length in sorted({(c["task"], c["length"]) for c in cs}):
            row = {c["depth"]: c for c in cs if (c["task"], c["length"]) == (task, length)}
            shown = [f"{row[d]['accuracy']:.2f} [{row[d]['ci95'][0]:.2f}, {row[d]['ci95'][1]:.2f}]" if d in row else "–"
                     for d in depths]
            lines.append([model, task, f"{length:,}", *shown, f"{next(iter(row.values()))['chance']:.2g}"])
    cells = {m: {f"{c['task']}/{c['length']}/{c['depth']}": c["accuracy"] for c in cs} for m, cs in rows.items()}
    return markdown(["model", "task", "length", *(f"depth {d}" for d in depths), "chance"], lines) + "\n", cells


def study_icl(found: dict[str, dict]) -> tuple[str, Cells]:
    """ICL accuracy by shots per row (its one method), with its seed-aware interval and the label baselines; the
    cells also hold each shot count's seconds per test item (`K/seconds_per_item`)."""
    lines, cells = [], {}
    for model, results in found.items():
        by_shots = next(iter(results["summary"]["test"].values()))
        cells[model] = {}
        for shots, cell in sorted(by_shots.items(), key=lambda kv: int(kv[0])):
            base = {k: v["mean"] for k, v in cell["baselines"].items()}
            cells[model] |= {shots: cell["accuracy_mean"], **{f"{shots}/{k}": v for k, v in base.items()}}
            if "seconds_per_item_mean" in cell:
                cells[model][f"{shots}/seconds_per_item"] = cell["seconds_per_item_mean"]
            ci = cell["accuracy_ci95"]
            lines.append([model, shots, f"{cell['accuracy_mean']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]", f"{base['chance']:.3f}",
                          f"{base['test_majority']:.3f}", f"{base['in_context_majority']:.3f}"])
    header = ["model", "shots", "accuracy [95% CI]", "chance", "test majority", "in-context majority"]
    return markdown(header, lines) + "\n", cells


def study_probe(found: dict[str, dict]) -> tuple[str, Cells]:
    """Per layer, at the farthest query bucket: the original attention's mass outside the window, EVA's error
    with its summaries and without them, per row."""
    first = next(iter(found.values()))
    a, b = first["buckets"][-1]
    header = ["layer", *(f"{s}: {k}" for s in found for k in ("outside", "error", "error off"))]
    rows = [[str(i), *(f for p in found.values() for f in (f"{p['layers'][i]['outside'][-1]:.3f}",
                                                          f"{p['layers'][i]['error'][-1]:.3g}",
                                                          f"{p['layers'][i]['error_no_remote'][-1]:.3g}"))]
            for i in range(len(first["layers"]))]
    text = (f"Queries at [{a:,}, {b:,}); error = mean squared error of the attention output per head (the transfer "
            "loss), `off` = the summaries off.\n\n" + markdown(header, rows))
    cells = {s: {f"{i}/{k}": layer[k][-1] for i, layer in enumerate(p["layers"])
                 for k in ("outside", "error", "error_no_remote")} for s, p in found.items()}
    return text + "\n", cells


READERS = {"ppl": study_ppl, "recall": study_recall, "icl": study_icl, "probe": study_probe}
"""A `[[summary.table]]` reader: the command whose results file each row folder holds -> its table."""


# ---------------------------------------------------------------- the recall study's folder

def _rank(arch: str) -> tuple[int, str]:
    """Table order: ARCHS, each EVA ablation after EVA."""
    from evalm.recall_models import ARCHS

    return ARCHS.index(arch.split("-")[0]), arch


def recall_cells(out: Path) -> list[dict]:
    """Every cell file under OUT/cells (each model's folder; its settings.json and markers aside)."""
    from evalm.config_toolkit import MissingInput

    found = [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*/*.json"))
             if p.name != "settings.json" and not p.name.startswith(".")]
    if not found:
        raise MissingInput(f"{out}/cells: no results yet; run the study first (evalm run --config "
                           "configs/study-recall.toml)")
    return found


def _accuracy_table(found: list[dict], test: str, axis: str) -> list[str]:
    """Accuracy [95% interval] per model and width by x, and chance."""
    rows = [c for c in found if c["test"] == test]
    xs = sorted({c["x"] for c in rows})
    lines = []
    for arch, width in sorted({(c["arch"], c["width"]) for c in rows}, key=lambda a: (a[1], _rank(a[0]))):
        by_x = {c["x"]: c for c in rows if (c["arch"], c["width"]) == (arch, width)}
        lines.append([arch, str(width), *(f"{by_x[x]['accuracy']:.2f} [{by_x[x]['ci95'][0]:.2f}, {by_x[x]['ci95'][1]:.2f}]"
                                          if x in by_x else "-" for x in xs)])
    chance = {c["x"]: c["chance"] for c in rows}
    lines.append(["chance", "", *(f"{chance[x]:.2g}" for x in xs)])
    return [f"\n**{test}**: accuracy [95% interval] by {axis}", "",
            markdown(["model", "width", *(f"{x:,}" for x in xs)], lines)]


def recall_study(out: Path) -> str:
    """The recall study: accuracy vs pairs per width, passkey and far MQAR vs length, and the cost of each model."""
    from evalm.recall_models import LOG, MODEL, StudyShape, reading_name

    found = recall_cells(out)
    lines = []
    for test, axis in (("kv", "key-value pairs (training length)"), ("passkey", "tokens"), ("mqar_far", "tokens")):
        lines += _accuracy_table(found, test, axis)
    models = []
    for folder in (out / "models").glob("*"):
        if (folder / LOG).is_file():
            shape = StudyShape(**json.loads((folder / MODEL).read_text()))
            models.append((reading_name(shape), shape.width, json.loads((folder / LOG).read_text())))
    rows = []
    for arch, width, log in sorted(models, key=lambda m: (m[1], _rank(m[0]))):
        per = {c["x"]: c["seconds_per_item"] for c in found
               if (c["arch"], c["width"]) == (arch, width) and c["test"] == "passkey"}
        rows.append([arch, str(width), f"{log['params']:,}", log.get("device", "not recorded"),
                     f"{log['seconds_per_step']:.2f}", ", ".join(f"{x:,}: {s:.1f}" for x, s in sorted(per.items()))])
    header = ["model", "width", "parameters", "device", "train s/step", "eval s/item at each length"]
    return "\n".join([*lines, "", markdown(header, rows)])


# ---------------------------------------------------------------- `evalm eval tables`

def command(argv: Sequence[str] | None = None) -> int:
    """`evalm eval tables`: each results.json (or A+B+C, one `evalm eval icl` run split by seed, pooled) as markdown."""
    from evalm.config_toolkit import MissingInput, Parser
    from evalm.icl_eval.report import merged, write_json
    from evalm.storage import read_json

    p = Parser(prog="evalm eval tables", description="The markdown table of each `evalm eval icl` or `evalm eval ppl` "
               "results.json; A+B+C pools icl runs that differ only in their seeds and writes <run>-merged.json beside them.")
    p.add_argument("results", nargs="+", metavar="RESULTS_JSON", help="results.json files, or A+B+C to pool (required: at least one; default: none)")
    for group in p.parse_args(argv).results:
        paths = group.split("+")
        missing = [q for q in paths if not Path(q).is_file()]
        if missing:
            raise MissingInput(f"{missing[0]}: no such results.json (has its `evalm eval` run finished?)")
        first = read_json(paths[0], "an `evalm eval` results.json")
        if "protocols" in first and len(paths) == 1:
            print(f"\n{group}\n\n" + run_ppl(first))
            continue
        res = merged(paths)  # summarised again: one run's table reads its records under the current rules
        if len(paths) > 1:
            write_json(Path(paths[0]).parent.parent / (Path(paths[0]).parent.name.rsplit("-seed", 1)[0]
                                                       + "-merged.json"), res)
        print(f"\n{group}\n\n" + run_icl(res))
    return 0
