"""Reports: `results.json`, `predictions.jsonl`, markdown tables, and PNG plots (matplotlib, Agg backend).

Tables (`evalm eval tables RESULTS_JSON...`): an `evalm eval icl` results.json per arm and cell (`icl_table`),
runs split by seed over processes pooled first (`merged`: A+B+C), and an `evalm eval ppl` results.json by
position bucket and block offset (`ppl_table`).

Plots: accuracy vs shots per method with its 95% bootstrap band and the label baselines as dashed
lines (docs/evaluation.md); time per test item vs shots (with cache reuse: incremental/structured/saicl;
without: concat; EVALM Figure 5); perplexity vs context length, one line per model and protocol,
beside the fixed-position curve and the uniform and unigram references (EVALM Figure 4).
Each plot takes several models' results at once, so a run's report can set EVA beside its twins.
Curves that agree (incremental == concat by construction) must both stay visible: each series has
its own marker and line style and is drawn a few points to the side of its neighbours (display
space; the data are untouched). Log axes are labelled with plain numbers (5.7, 200), not 5.7×10⁰.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from evalm.storage import read_json, replaced, write_atomic


def write_json(path: Path, data: Any) -> Path:
    """`data` as indented JSON, written whole or not at all and never through a link (`storage.write_atomic`)."""
    return write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def write_predictions(path: Path, rows: list[dict]) -> Path:
    return write_atomic(path, "".join(json.dumps(row) + "\n" for row in rows))


def _ci(pair, signed: bool = False) -> str:
    f = "{:+.3f}" if signed else "{:.3f}"
    return "[" + ", ".join(f.format(x) for x in pair) + "]"


def merged(paths) -> dict:
    """One results.json from runs that differ only in their draw or order seeds (one process per seed, side by
    side): the records and baseline records pooled and summarised again, so the intervals resample every seed."""
    from evalm.icl_eval.stats.summary import summarize

    runs = [read_json(p, "an `evalm eval icl` results.json") for p in paths]
    records = [r for res in runs for r in res["records"]]
    first: dict[tuple, dict] = {}  # a run per order seed repeats its draw's baselines: the first order's, as one run
    for b in (b for res in runs for b in res["baseline_records"]):
        first.setdefault((b["split"], b["seed"], b["shots"], b.get("budget"), b.get("arm", ""), b.get("item_set", 0)), b)
    baselines = list(first.values())
    protocol = {**runs[0]["protocol"], "label_maps": {k: v for res in runs for k, v in res["protocol"]["label_maps"].items()}}
    protocol["eval"] = {**protocol["eval"], "seeds": sorted({r["seed"] for r in records})}
    return {"protocol": protocol, "summary": summarize(records, baselines), "records": records,
            "baseline_records": baselines, "merged_from": [str(p) for p in paths]}


def icl_table(res: dict) -> str:
    """Markdown of one `evalm eval icl` results.json: per arm and cell, accuracy [CI] ± draw std, the
    best label baseline, Δ vs 0 shots, the draw/order spread, and each arm's paired Δ to the main arm."""
    summary, ev = res["summary"], res["protocol"]["eval"]
    axis = summary.get("axis", "shots")
    lines = [f"| {res['protocol']['task']} `--label-map {ev['label_map']}` | {axis} | accuracy [95% CI] ± draw std | "
             "best label baseline | vs that baseline [CI] | Δ vs 0 [CI] | spread: draws / orders | arm Δ vs main [CI] |",
             "|---|---|---|---|---|---|---|---|"]
    for name, cells in summary["test"].items():
        for k, c in sorted(cells.items(), key=lambda kv: int(kv[0])):
            base = c["baselines"][c["gain"]["over"]]
            where = k + (f" ({'/'.join(map(str, c['shots_per_seed']))} shots, "
                         f"{'/'.join(map(str, c['prompt_tokens_per_seed']))} tokens)" if "shots_per_seed" in c else "")
            used = c.get("demos_used_mean_mean")
            if used is not None and "shots_per_seed" not in c and 0 < used < int(k) - 0.05:  # past the window: drop_left
                where += f" ({used:.1f} used)"
            d0 = c.get("vs_0_shots")
            spread = c.get("order_split")
            arm = c.get("vs_base")
            slr = c.get("sample_learning_ratio")
            lines.append(
                f"| {name} | {where} | {c['accuracy_mean']:.3f} {_ci(c['accuracy_ci95'])} ±{c['accuracy_std']:.3f} | "
                f"{c['gain']['over']} {base['mean']:.3f} {_ci(base['ci95'])} | "
                f"{c['gain']['mean']:+.3f} {_ci(c['gain']['ci95'], True)} | "
                + (f"{d0['mean']:+.3f} {_ci(d0['ci95'], True)}" if d0 else "-") + " | "
                + (f"{spread['draw_std']:.3f} {_ci(spread['draw_std_ci95'])} / {spread['order_std']:.3f} "
                   f"{_ci(spread['order_std_ci95'])}" if spread else "-") + " | "
                + (f"{arm['mean']:+.3f} {_ci(arm['ci95'], True)}" if arm else "-")
                + (f"; SLR {slr:.2f}" if slr is not None else "; SLR undefined" if "sample_learning_ratio" in c else "")
                + " |")
    return "\n".join(lines)


def ppl_table(res: dict) -> str:
    """Markdown of one `evalm eval ppl` results.json: token perplexity per bucket for each protocol and reference,
    then by a token's offset in its block where the run measured it (`--by-offset`)."""
    rows = {**res["protocols"], **res["references"]}
    edges = [tuple(b["bucket"]) for b in next(iter(rows.values()))["buckets"]]
    lines = ["| protocol | " + " | ".join(f"[{lo:,}, {hi:,})" for lo, hi in edges) + " |", "|---|" + "---|" * len(edges)]
    for name, proto in rows.items():
        ppl = {tuple(b["bucket"]): b["token_ppl"] for b in proto["buckets"]}
        lines.append(f"| {name} | " + " | ".join(f"{ppl[e]:.2f}" if e in ppl else "-" for e in edges) + " |")
    offsets = {name: p["block_offsets"] for name, p in res["protocols"].items() if p.get("block_offsets")}
    for name, found in offsets.items():
        lines += ["", f"{name}, by a token's offset in its block:", "",
                  "| " + " | ".join(f"[{r['offsets'][0]}, {r['offsets'][1]})" for r in found) + " |",
                  "|" + "---|" * len(found), "| " + " | ".join(f"{r['token_ppl']:.1f}" for r in found) + " |"]
    return "\n".join(lines)


def tables(argv: Sequence[str] | None = None) -> int:
    """`evalm eval tables`: each results.json (or A+B+C, one `evalm eval icl` run split by seed, pooled) as markdown."""
    from evalm.config_toolkit import MissingInput, Parser

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
            print(f"\n{group}\n\n" + ppl_table(first))
            continue
        res = merged(paths)  # summarised again: one run's table reads its records under the current rules
        if len(paths) > 1:
            write_json(Path(paths[0]).parent.parent / (Path(paths[0]).parent.name.rsplit("-seed", 1)[0]
                                                       + "-merged.json"), res)
        print(f"\n{group}\n\n" + icl_table(res))
    return 0


@contextmanager
def _figure(path: Path, title: str, panels: int = 1):
    """Axes to draw on (one per panel), gridded, legended and saved to `path` on exit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.2), squeeze=False)
    yield list(axes[0])
    for ax in axes[0]:
        ax.grid(alpha=0.3)
        if ax.get_legend() is None:  # a panel may have placed its own
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    try:
        with replaced(path) as tmp:  # whole or not at all, never through a link
            fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")  # a legend outside the axes stays in the image
    finally:
        plt.close(fig)


MARKERS, LINESTYLES = "osD^v<>", ("-", "--", "-.", ":")
POINTS_APART = 3.0
"""How far apart (in points) neighbouring series are drawn along x."""


def _series(ax, j: int, n: int, x: list, y: list, label: str):
    """Series j of n: its own marker and line style, x moved (j - (n-1)/2) * `POINTS_APART` points in
    display space so a curve equal to another is drawn beside it, not under it. Returns the line."""
    from matplotlib.transforms import ScaledTranslation

    shift = ScaledTranslation((j - (n - 1) / 2) * POINTS_APART / 72, 0, ax.figure.dpi_scale_trans)
    line, = ax.plot(x, y, label=label, marker=MARKERS[j % len(MARKERS)], linestyle=LINESTYLES[j % len(LINESTYLES)],
                    transform=ax.transData + shift)
    ax.update_datalim(list(zip(x, y)))  # a shifted transform hides the data from autoscaling
    ax.autoscale_view()
    return line


def _plain_log_labels(axis) -> None:
    """Plain numbers on a log axis (5.7, 200, 1000): matplotlib's default labels a short range's
    minor ticks as 5.7×10⁰."""
    from matplotlib.ticker import LogFormatter

    axis.set_major_formatter(LogFormatter(labelOnlyBase=False))
    axis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.4)))


def _shot_axis(ax, shots: list[int]) -> None:
    """Symlog x axis (linear below 1, so 0 and 1 shots read cleanly) ticked at the shots used."""
    ax.set_xscale("symlog", linthresh=1, linscale=0.5)
    ax.set_xticks(shots)
    ax.set_xticklabels([str(k) for k in shots])
    ax.set_xlim(min(shots) - 0.3 if min(shots) == 0 else min(shots) * 0.8, max(shots) * 1.25)


BASELINE_LABELS = {"chance": "chance", "test_majority": "test-set majority label",
                   "in_context_majority": "in-context majority label"}


def plot_accuracy(summaries: dict[str, dict], path: Path, title: str, methods: tuple[str, ...] | None = None) -> Path:
    """Accuracy vs shots (or vs token budget, `summary["axis"]`): per model (key, "" for one) and method, the mean over seeds with its 95%
    hierarchical bootstrap band; the label baselines of the first model as dashed lines."""
    first = next(iter(summaries.values()))["test"]
    series = [(f"{model} {method}".strip(), shots) for model, summary in summaries.items()
              for method, shots in summary["test"].items() if not methods or method in methods]
    with _figure(path, title) as (ax,):
        for j, (label, shots) in enumerate(series):
            ks = sorted(shots, key=int)
            line = _series(ax, j, len(series), [int(k) for k in ks], [shots[k]["accuracy_mean"] for k in ks], label)
            ax.fill_between([int(k) for k in ks], [shots[k]["accuracy_ci95"][0] for k in ks],
                            [shots[k]["accuracy_ci95"][1] for k in ks], alpha=0.15, color=line.get_color(),
                            transform=line.get_transform())
        cells = next(iter(first.values()))
        ks = sorted(cells, key=int)
        for name, style in zip(BASELINE_LABELS, (":", "--", "-.")):
            ax.plot([int(k) for k in ks], [cells[k]["baselines"][name]["mean"] for k in ks], style, color="grey",
                    label=BASELINE_LABELS[name])
        _shot_axis(ax, [int(k) for k in ks])
        by_budget = next(iter(summaries.values())).get("axis") == "budget"
        xlabel = "token budget (prompt tokens; 0 = no demonstrations)" if by_budget else "shots (demonstrations)"
        ax.set(xlabel=xlabel, ylabel="accuracy (mean over seeds, 95% bootstrap band)", ylim=(0, 1.02))
    return path


def plot_time(summary: dict, path: Path, title: str) -> Path:
    with _figure(path, title) as (ax,):
        shots = set()
        for j, (method, cells) in enumerate(summary["test"].items()):
            ks = sorted(cells, key=int)
            shots.update(int(k) for k in ks)
            label = f"{method} ({'no cache reuse' if method == 'concat' else 'cache reuse'})"
            _series(ax, j, len(summary["test"]), [int(k) for k in ks], [cells[k]["seconds_per_item_mean"] * 1e3 for k in ks],
                    label)
        _shot_axis(ax, sorted(shots))
        ax.set_yscale("log")
        _plain_log_labels(ax.yaxis)
        ax.set(xlabel="shots", ylabel="ms per test item (incl. context encoding)")
    return path


def plot_perplexity(results: dict[str, dict], path: Path, title: str, train_length: int | None = None) -> Path:
    """Left: token perplexity per position bucket through the cache (every token with its whole
    prefix), per model (key, "" for one), with the uniform and unigram references as dashed lines;
    a single model also shows its re-encoding protocols. Right (when measured): the fixed-position
    curve, the same targets after longer and longer contexts, on a linear axis so that differences
    read; its references (far above) are named in the axis label."""
    first = next(iter(results.values()))
    panels = 2 if any("fixed_position" in r for r in results.values()) else 1
    markers = "osd^v<>"
    with _figure(path, title, panels) as axes:
        ax = axes[0]
        for i, (model, res) in enumerate(results.items()):
            for name, proto in res["protocols"].items():
                if len(results) > 1 and name != "cached":
                    continue
                rows = proto["buckets"]
                ax.plot([r["bucket"][1] for r in rows], [r["token_ppl"] for r in rows], marker=markers[i % 7],
                        linestyle="-" if name == "cached" else ":", label=f"{model} {name}".strip())
        for (name, ref), style in zip(first.get("references", {}).items(), ("--", ":")):
            ax.axhline(ref["overall"]["token_ppl"], linestyle=style, color="grey",
                       label=f"{name} reference ({ref['overall']['token_ppl']:.0f})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        _plain_log_labels(ax.yaxis)
        ax.set(xlabel="position in the book (tokens, bucket upper end)", ylabel="token perplexity (cached)")
        # Below the axes: the references span the whole width, so no corner inside is free of lines.
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
        if panels == 2:
            ax = axes[1]
            for i, (model, res) in enumerate(results.items()):
                rows = res.get("fixed_position", {}).get("rows", [])
                if rows:
                    ax.plot([r["context"] for r in rows], [r["token_ppl"] for r in rows], marker=markers[i % 7],
                            linestyle=("-", "--", ":")[i % 3], label=model or "model")
            refs = next(r["fixed_position"]["references"] for r in results.values() if "fixed_position" in r)
            if train_length:
                ax.axvline(train_length, color="black", alpha=0.4, label=f"training length {train_length}")
            ax.set_xscale("log", base=2)
            named = ", ".join(f"{k} {v['token_ppl']:.0f}" for k, v in refs.items())
            ax.set(xlabel="context length before the same targets (tokens)",
                   ylabel=f"token perplexity of the targets\n(references: {named})")
    return path
