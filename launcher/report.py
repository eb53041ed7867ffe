"""The run's report folder: `results.json`, the plots, and a short `summary.md`.

Everything is read back from the stages' own outputs (their results.json, manifests and markers),
so the report can be rebuilt from disk and says exactly what ran, with its protocol.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from evalm.config import to_dict


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _stage_seconds(r, timings: dict[str, float]) -> dict[str, float]:
    from launcher.run import MARKER, STAGES

    out = {}
    for stage in STAGES:
        marker = _read(r.stage_dir(stage) / MARKER)
        if marker is not None:
            out[stage] = round(marker["seconds"], 1)
    return out


def _icl_headline(summary: dict) -> dict[str, dict[str, Any]]:
    """Per method: accuracy (mean ± std over seeds) at the smallest and the largest shot count."""
    out = {}
    for method, shots in summary.get("test", {}).items():
        ks = sorted(int(k) for k in shots)
        low, high = ks[0], ks[-1]
        out[method] = {"low_shots": low, "low": shots[str(low)]["accuracy_mean"], "low_std": shots[str(low)]["accuracy_std"],
                       "high_shots": high, "high": shots[str(high)]["accuracy_mean"], "high_std": shots[str(high)]["accuracy_std"],
                       "seconds_per_item_high": shots[str(high)]["seconds_per_item_mean"]}
    return out


def write_report(r, timings: dict[str, float], *, wall_seconds: float, peak_rss_gib: float) -> Path:
    out = r.dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    icl = {}
    for entry in r.evals:
        folder = r.stage_dir("icl") / entry.name
        results = _read(folder / "results.json")
        if results is None:
            continue
        icl[entry.name] = {"protocol": results["protocol"], "summary": results["summary"],
                           "headline": _icl_headline(results["summary"])}
        for png in folder.glob("*.png"):
            shutil.copyfile(png, out / f"icl_{entry.name}_{png.name}")
    ppl = _read(r.stage_dir("ppl") / "results.json")
    if ppl is not None:
        for png in r.stage_dir("ppl").glob("*.png"):
            shutil.copyfile(png, out / png.name)
    data = {name: _read(r.stage_dir(name) / "manifest.json") for name in ("filter", "dedup", "blend")}
    results = {
        "run": {"config": str(r.path), "folder": str(r.dir), "samples": str(r.samples),
                "sections": {"run": to_dict(r.run), "tokenizer": to_dict(r.tokenizer), "pretrain": to_dict(r.pretrain),
                             "msit": to_dict(r.msit), "eval": [to_dict(e) for e in r.evals], "ppl": to_dict(r.ppl)}},
        "stage_seconds": _stage_seconds(r, timings),
        "wall_seconds_this_invocation": round(wall_seconds, 1),
        "peak_rss_gib": round(peak_rss_gib, 2),
        "data": {name: (m or {}).get("stats", m) for name, m in data.items()},
        "icl": icl,
        "ppl": ppl,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (out / "summary.md").write_text(summary_markdown(results))
    return out


def summary_markdown(results: dict) -> str:
    lines = [f"# EVALM run: {results['run']['folder']}", "",
             f"Config `{results['run']['config']}`; samples `{results['run']['samples']}`. "
             f"This invocation: {results['wall_seconds_this_invocation']:.0f} s wall, peak RSS "
             f"{results['peak_rss_gib']:.2f} GiB.", "", "## Stages", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {stage} | {sec:.1f} |" for stage, sec in results["stage_seconds"].items()]
    for name, block in results["icl"].items():
        proto = block["protocol"]
        ev = proto["eval"]
        lines += ["", f"## ICL: {name}", "",
                  f"Task `{proto['task']}`, template `{proto['template']}`, scoring `{proto['scoring']}`, "
                  f"separator `{ev['separator']}`, seeds {list(ev['seeds'])}, shots {list(ev['shots'])}, "
                  f"at most {ev['max_test_items']} test items; model {proto['model'].get('name', '?')}.", "",
                  "| method | accuracy at fewest shots | accuracy at most shots | s / test item at most shots |", "|---|---|---|---|"]
        for method, h in block["headline"].items():
            lines.append(f"| {method} | {h['low']:.3f} ± {h['low_std']:.3f} ({h['low_shots']} shots) | "
                         f"{h['high']:.3f} ± {h['high_std']:.3f} ({h['high_shots']} shots) | {h['seconds_per_item_high']:.4f} |")
        lines.append(f"\n![accuracy vs shots](icl_{name}_accuracy_vs_shots.png)")
    if results["ppl"]:
        lines += ["", "## Perplexity vs context length", "", "| protocol | tokens | token ppl | word ppl |", "|---|---|---|---|"]
        for name, p in results["ppl"]["protocols"].items():
            o = p["overall"]
            word = f"{o['word_ppl']:.1f}" if o.get("word_ppl") else "-"
            lines.append(f"| {name} | {o['tokens']} | {o['token_ppl']:.2f} | {word} |")
        lines.append("\n![perplexity vs length](perplexity_vs_length.png)")
    return "\n".join(lines) + "\n"
