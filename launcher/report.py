"""The run's report folder: `results.json`, the plots, and a short `summary.md`.

Everything is read back from the stages' own outputs (their results.json, manifests, metrics and
markers), so the report can be rebuilt from disk and says exactly what ran, with its protocol.
Every accuracy stands beside its label baselines with a 95% hierarchical bootstrap interval and
the headline is the gain over the best baseline (docs/evaluation.md); every perplexity beside the uniform
and unigram references (§6). The run's time and memory come from the stage markers, so a rerun
that skips stages keeps the first invocation's figures and records its own beside them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from evalm.config_toolkit import to_dict
from evalm.icl_eval.report import plot_accuracy, plot_perplexity
from evalm.launcher.markers import MARKER
from evalm.launcher.run_file import Run
from evalm.launcher.summary import summary_markdown
from evalm.storage import replaced, write_atomic


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _last_loss(folder: Path) -> str:
    path = folder / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    return f"final loss {json.loads(lines[-1])['loss']:.3f}" if lines else "no metrics"


def stage_result(r: Run, stage: str) -> str:
    """One line saying what a finished stage produced, for the console."""
    folder = r.stage_dir(stage)
    if stage in ("filter", "dedup"):
        stats = (_read(folder / "manifest.json") or {}).get("stats", {})
        kept, seen = sum(stats.get("documents_kept", {}).values()), sum(stats.get("documents_in", {}).values())
        return f"kept {kept} of {seen} documents"
    if stage == "tokenizer":
        manifest = _read(folder / "manifest.json") or {}
        return f"{manifest.get('tokens', 0):,} tokens, vocabulary {manifest.get('vocab_size')}"
    if stage in ("pretrain", "msit"):
        return _last_loss(folder)
    if stage == "twins":
        return "; ".join(f"{p.parent.name} {p.name}: {_last_loss(p)}" for p in sorted(folder.glob("*/*")) if p.is_dir())
    if stage == "icl":
        return "; ".join(f"{name}/{model}: {h['method']} {h['accuracy']:.2f} at {h['shots']} shots, "
                         f"{h['gain']:+.2f} over {h['over']}" for name, model, h in _icl_headlines(r))
    if stage == "ppl":
        rows = []
        for model, res in _ppl_results(r).items():
            unigram = res.get("references", {}).get("unigram", {}).get("overall", {}).get("token_ppl")
            rows.append(f"{model} {res['protocols']['cached']['overall']['token_ppl']:.0f}"
                        + (f" (unigram {unigram:.0f})" if unigram else ""))
        return "token perplexity " + ", ".join(rows)
    if stage == "recall":
        return recall_line(_recall_results(r))
    return "done"


def _recall_results(r: Run) -> dict[str, dict]:
    return {m: res for m in r.recall.models if (res := _read(r.stage_dir("recall") / m / "results.json")) is not None}


def recall_line(results: dict[str, dict]) -> str:
    """The run's one recall line: per task, each model's accuracy (mean over depths) at each length."""
    rows = []
    for model, res in results.items():
        by = {}
        for c in res["cells"]:
            by.setdefault(c["task"], {}).setdefault(c["length"], []).append(c["accuracy"])
        rows += [(task, model, lengths, res["cells"][0]["chance"]) for task, lengths in by.items()]
    parts = []
    for task in dict.fromkeys(t for t, *_ in rows):
        mine = [row for row in rows if row[0] == task]
        lengths = " / ".join(f"{n:,}" for n in mine[0][2])
        scores = "; ".join(f"{model} " + " / ".join(f"{sum(a) / len(a):.2f}" for a in acc.values())
                           for _, model, acc, _ in mine)
        parts.append(f"{task} at {lengths} tokens: {scores} (chance {mine[0][3]:.2g})")
    return ". ".join(parts) or "no recall results"


def _icl_results(r: Run) -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = {}
    for entry in r.evals:
        for model in entry.models:
            res = _read(r.stage_dir("icl") / entry.name / model / "results.json")
            if res is not None:
                out.setdefault(entry.name, {})[model] = res
    return out


def headline(summary: dict, method: str) -> dict[str, Any]:
    """The method at its largest shot count: accuracy with interval, and its gain over the best baseline."""
    cells = summary["test"][method]
    k = max(cells, key=int)
    c = cells[k]
    return {"method": method, "shots": int(k), "accuracy": c["accuracy_mean"], "accuracy_ci95": c["accuracy_ci95"],
            "baselines": {name: b["mean"] for name, b in c["baselines"].items()},
            "over": c["gain"]["over"], "gain": c["gain"]["mean"], "gain_ci95": c["gain"]["ci95"]}


def _icl_headlines(r: Run):
    for name, models in _icl_results(r).items():
        for model, res in models.items():
            method = next(iter(res["summary"]["test"]))
            yield name, model, headline(res["summary"], method)


def _ppl_results(r: Run) -> dict[str, dict]:
    return {m: res for m in r.ppl.models if (res := _read(r.stage_dir("ppl") / m / "results.json")) is not None}


def _run_totals(r: Run) -> dict[str, Any]:
    """Seconds per stage and the whole run's peak memory, from the markers (not this invocation)."""
    seconds, peak, jobs = {}, 0.0, 1
    for marker_path in sorted(r.dir.glob(f"*/{MARKER}")):
        marker = json.loads(marker_path.read_text())
        seconds[marker["stage"]] = round(marker["seconds"], 1)
        peak = max(peak, marker.get("peak_rss_gib_so_far", 0.0))
        jobs = max(jobs, marker.get("jobs", 1))
    return {"stage_seconds": seconds, "seconds": round(sum(seconds.values()), 1), "peak_rss_gib": round(peak, 2),
            "jobs": jobs}


def write_report(r: Run, timings: dict[str, float], *, wall_seconds: float, peak_rss_gib: float) -> Path:
    out = r.dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    icl = {}
    for name, models in _icl_results(r).items():
        icl[name] = {model: {"protocol": res["protocol"], "summary": res["summary"],
                             "headline": {m: headline(res["summary"], m) for m in res["summary"]["test"]}}
                     for model, res in models.items()}
        plot_accuracy({_label(m): res["summary"] for m, res in models.items()}, out / f"icl_{name}_accuracy_vs_shots.png",
                      f"{name}: accuracy vs shots ({', '.join(models)})", methods=None if len(models) == 1 else ("incremental",))
    ppl = _ppl_results(r)
    if ppl:
        train_length = (_read(r.stage_dir("pretrain") / "config.json") or {}).get("data", {}).get("seq_len")
        plot_perplexity({_label(m): res for m, res in ppl.items()}, out / "perplexity_vs_length.png",
                        "perplexity vs context length (two books)", train_length=train_length)
    for png in r.stage_dir("icl").glob("*/*/*.png"):
        with replaced(out / f"icl_{png.parent.parent.name}_{png.parent.name}_{png.name}") as tmp:
            shutil.copyfile(png, tmp)
    data = {name: _read(r.stage_dir(name) / "manifest.json") for name in ("filter", "dedup", "blend")}
    results = {
        "run": {"config": str(r.path), "folder": str(r.dir), "samples": str(r.samples),
                "sections": {"run": to_dict(r.run), "tokenizer": to_dict(r.tokenizer), "pretrain": to_dict(r.pretrain),
                             "msit": to_dict(r.msit), "twins": to_dict(r.twins), "eval": [to_dict(e) for e in r.evals],
                             "ppl": to_dict(r.ppl), "recall": to_dict(r.recall)}},
        "run_totals": _run_totals(r),
        "this_invocation": {"wall_seconds": round(wall_seconds, 1), "peak_rss_gib": round(peak_rss_gib, 2),
                            "stages_run": [s for s, sec in timings.items() if sec > 0]},
        "data": {name: (m or {}).get("stats", m) for name, m in data.items()},
        "icl": icl,
        "ppl": ppl,
        "pretrain_seq_len": train_length if ppl else None,
        "recall": {"line": recall_line(recall), "models": recall} if (recall := _recall_results(r)) else None,
    }
    write_atomic(out / "results.json", json.dumps(results, indent=2, default=str) + "\n")
    write_atomic(out / "summary.md", summary_markdown(results))
    return out


def _label(model: str) -> str:
    """Plot labels: which attention and positions a run's model has."""
    return {"pretrain": "EVA pretrained", "msit": "EVA tuned", "full-pretrain": "full attention pretrained",
            "full-msit": "full attention tuned", "absolute-pretrain": "EVA absolute positions, pretrained"}.get(model, model)
