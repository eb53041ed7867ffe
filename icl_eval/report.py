"""Reports: `results.json`, `predictions.jsonl`, pooled runs, and PNG plots (matplotlib, Agg backend).

Pooling (`merged`: A+B+C): runs split by seed over processes summarised again as one, for
`evalm eval tables` (its markdown is icl_eval/tables.py's, the one table writer).

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
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from evalm.storage import read_json, replaced, write_atomic


def write_json(path: Path, data: Any) -> Path:
    """`data` as indented JSON, written whole or not at all and never through a link (`storage.write_atomic`)."""
    return write_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def write_predictions(path: Path, rows: list[dict]) -> Path:
    return write_atomic(path, "".join(json.dumps(row) + "\n" for row in rows))


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
