"""Reports: `results.json`, `predictions.jsonl`, and PNG plots (matplotlib, Agg backend).

Plots: accuracy vs shots per method with ±std bands; time per test item vs shots (with cache reuse:
incremental/structured/saicl; without: concat; EVALM Figure 5); perplexity vs context length, one
line per protocol (EVALM Figure 4).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return path


def write_predictions(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return path


@contextmanager
def _figure(path: Path, xlabel: str, ylabel: str, title: str):
    """A 6x4 axes to draw on; labelled, gridded, legended and saved to `path` on exit."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    yield ax
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _series(summary_split: dict, key: str):
    for method, shots in summary_split.items():
        ks = sorted(shots, key=int)
        yield method, [int(k) for k in ks], [shots[k][f"{key}_mean"] for k in ks], [shots[k][f"{key}_std"] for k in ks]


def plot_accuracy(summary: dict, path: Path, title: str) -> Path:
    with _figure(path, "shots (demonstrations)", "accuracy (mean ± std over seeds)", title) as ax:
        for method, x, y, s in _series(summary["test"], "accuracy"):
            ax.plot(x, y, marker="o", label=method)
            ax.fill_between(x, [a - b for a, b in zip(y, s)], [a + b for a, b in zip(y, s)], alpha=0.2)
        ax.set_xscale("symlog", linthresh=1)
    return path


def plot_time(summary: dict, path: Path, title: str) -> Path:
    with _figure(path, "shots", "ms per test item (incl. context encoding)", title) as ax:
        for method, x, y, _ in _series(summary["test"], "seconds_per_item"):
            style = "--" if method == "concat" else "-"
            label = f"{method} ({'no cache reuse' if method == 'concat' else 'cache reuse'})"
            ax.plot(x, [v * 1e3 for v in y], style, marker="o", label=label)
        ax.set_xscale("symlog", linthresh=1)
        ax.set_yscale("log")
    return path


def plot_perplexity(results: dict, path: Path, title: str) -> Path:
    with _figure(path, "context length (tokens, bucket upper end)", "token perplexity", title) as ax:
        for name, proto in results["protocols"].items():
            rows = proto["buckets"]
            ax.plot([r["bucket"][1] for r in rows], [r["token_ppl"] for r in rows], marker="o", label=name)
        ax.set_xscale("log", base=2)
    return path
