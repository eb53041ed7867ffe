"""`evalm study summary`: the tables of configs/study-summaries.toml from its folder, and its goals checked.

    evalm study summary --root runs/summaries --trained-length 8192      # writes ROOT/summary.md, prints it

Every figure is read from the stages' own files (ROOT/ppl/*/results.json, recall/*, icl/*, probe/*/probe.json,
lora/trainables.safetensors), each beside its reference: perplexity beside the uniform and unigram references
of the same book and buckets, recall beside chance, ICL beside chance, the test set's majority label and the
in-context majority; every EVA reading beside the same weights with the summaries off (`-off`, no-remote) and
the window-only control. The goals (docs/findings.md) are checked where their buckets were measured, and
said to be unmeasured where not. Reads JSON only: no model is loaded.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from evalm.config_toolkit import MissingInput, Parser
from evalm.storage import read_json, sha256, write_atomic

PPL = ("original", "eva-0", "eva-0-off", "transfer", "lora", "lora-off", "window")
RECALL = ("original", "lora", "lora-off", "window")
ICL = ("original", "lora", "lora-off")
PROBES = ("eva-0", "transfer", "lora")


def _fmt(value, digits: int = 1) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def ppl_table(root: Path) -> tuple[str, dict[str, dict[tuple[int, int], float]]]:
    """Token perplexity by position (the cache's protocol) per model, the references as rows below."""
    found = {m: read_json(root / "ppl" / m / "results.json") for m in PPL if (root / "ppl" / m / "results.json").is_file()}
    if not found:
        return "no perplexity results yet\n", {}
    by_model = {m: {tuple(b["bucket"]): b["token_ppl"] for b in r["protocols"]["cached"]["buckets"]} for m, r in found.items()}
    first = next(iter(found.values()))
    for name, ref in first["references"].items():  # uniform, unigram: the same book and buckets for every model
        by_model[f"({name})"] = {tuple(b["bucket"]): b["token_ppl"] for b in ref["buckets"]}
    buckets = sorted({b for rows in by_model.values() for b in rows})
    lines = ["| model | " + " | ".join(f"[{a:,}, {b:,})" for a, b in buckets) + " |", "|---" * (len(buckets) + 1) + "|"]
    lines += [f"| {m} | " + " | ".join(_fmt(rows.get(b)) for b in buckets) + " |" for m, rows in by_model.items()]
    return "\n".join(lines) + "\n", by_model


def recall_table(root: Path) -> tuple[str, list[dict]]:
    """Exact-match recall per model, family and length, by needle depth, with chance."""
    cells = []
    for model in RECALL:
        path = root / "recall" / model / "results.json"
        if path.is_file():
            cells += [{**c, "model": model} for c in read_json(path)["cells"]]
    if not cells:
        return "no recall results yet\n", []
    depths = sorted({c["depth"] for c in cells})
    lines = ["| model | family | length | " + " | ".join(f"depth {d}" for d in depths) + " | chance |",
             "|---" * (len(depths) + 4) + "|"]
    keys = sorted({(c["model"], c["task"], c["length"]) for c in cells}, key=lambda k: (RECALL.index(k[0]), k[1], k[2]))
    for model, task, length in keys:
        row = {c["depth"]: c for c in cells if (c["model"], c["task"], c["length"]) == (model, task, length)}
        shown = [f"{row[d]['accuracy']:.2f} [{row[d]['ci95'][0]:.2f}, {row[d]['ci95'][1]:.2f}]" if d in row else "–"
                 for d in depths]
        chance = next(iter(row.values()))["chance"]
        lines.append(f"| {model} | {task} | {length:,} | " + " | ".join(shown) + f" | {chance:.2g} |")
    return "\n".join(lines) + "\n", cells


def icl_table(root: Path) -> tuple[str, dict[str, dict]]:
    """ICL accuracy by shots per model, with its seed-aware interval and the three label baselines."""
    found = {}
    for model in ICL:
        path = root / "icl" / model / "results.json"
        if path.is_file():
            found[model] = next(iter(read_json(path)["summary"]["test"].values()))  # the one method
    if not found:
        return "no ICL results yet\n", {}
    lines = ["| model | shots | accuracy [95% CI] | chance | test majority | in-context majority |", "|---" * 6 + "|"]
    for model, by_shots in found.items():
        for shots, cell in sorted(by_shots.items(), key=lambda kv: int(kv[0])):
            base = cell["baselines"]
            lines.append(f"| {model} | {shots} | {cell['accuracy_mean']:.3f} [{cell['accuracy_ci95'][0]:.3f}, "
                         f"{cell['accuracy_ci95'][1]:.3f}] | {base['chance']['mean']:.3f} | "
                         f"{base['test_majority']['mean']:.3f} | {base['in_context_majority']['mean']:.3f} |")
    return "\n".join(lines) + "\n", found


def probe_table(root: Path) -> str:
    """Per layer, at the farthest query bucket: the original attention's mass outside the window, EVA's error
    with its summaries and without them, at each stage."""
    found = {s: read_json(root / "probe" / s / "probe.json") for s in PROBES if (root / "probe" / s / "probe.json").is_file()}
    if not found:
        return "no probe results yet\n"
    first = next(iter(found.values()))
    a, b = first["buckets"][-1]
    lines = [f"Queries at [{a:,}, {b:,}); error = mean squared error of the attention output per head (the transfer "
             "loss), `off` = the summaries off.", "",
             "| layer | " + " | ".join(f"{s}: outside | {s}: error | {s}: error off" for s in found) + " |",
             "|---" * (3 * len(found) + 1) + "|"]
    for i in range(len(first["layers"])):
        cells = [f"{p['layers'][i]['outside'][-1]:.3f} | {p['layers'][i]['error'][-1]:.3g} | "
                 f"{p['layers'][i]['error_no_remote'][-1]:.3g}" for p in found.values()]
        lines.append(f"| {i} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def goals(ppl: dict, cells: list[dict], icl: dict, trained: int) -> list[str]:
    """The study's goals, each met, missed or unmeasured, with the figures it was decided on."""
    out = []
    near, lora, off, original = (trained // 2, trained), ppl.get("lora", {}), ppl.get("lora-off", {}), ppl.get("original", {})
    if near in lora and near in off and near in original:
        ok = lora[near] < off[near] and lora[near] <= 1.05 * original[near]
        out.append(f"- [{near[0]:,}, {near[1]:,}) with summaries below without and within 5% of the original: "
                   f"{'met' if ok else 'missed'} ({lora[near]:.1f} vs {off[near]:.1f} off, original {original[near]:.1f})")
        far = {b: v for b, v in lora.items() if b[0] >= trained}
        worst = max(far.items(), key=lambda kv: kv[1], default=None)
        if worst is not None:
            out.append(f"- flat past {trained:,} with summaries on (no bucket > 1.10 x [{near[0]:,}, {near[1]:,})): "
                       f"{'met' if worst[1] <= 1.10 * lora[near] else 'missed'} (worst {worst[1]:.1f} at {worst[0]})")
    else:
        out.append(f"- perplexity goals: unmeasured (no [{near[0]:,}, {near[1]:,}) bucket for lora, lora-off and original)")
    far_cells = [c for c in cells if c["task"] == "niah_single" and c["length"] == 2 * trained and c["depth"] in (0, 50)]
    on = [c["accuracy"] for c in far_cells if c["model"] == "lora"]
    without = [c["accuracy"] for c in far_cells if c["model"] == "lora-off"]
    out.append(f"- a needle at depth 0 or 50 of {2 * trained:,} tokens found in >= 50% with summaries, none without: "
               + (f"{'met' if on and max(on) >= 0.5 and not any(without) else 'missed'} (on {on}, off {without})"
                  if on and without else "unmeasured"))
    shots = icl.get("lora", {})
    if "1024" in shots and "256" in shots:
        a, b = shots["1024"], shots["256"]
        ok = a["accuracy_mean"] >= b["accuracy_mean"] and a["accuracy_mean"] > a["baselines"]["test_majority"]["mean"]
        out.append(f"- ICL at 1,024 shots >= 256 and above the test majority: {'met' if ok else 'missed'} "
                   f"({a['accuracy_mean']:.3f} vs {b['accuracy_mean']:.3f}, majority {a['baselines']['test_majority']['mean']:.3f})")
    else:
        out.append("- ICL at 1,024 vs 256 shots: unmeasured")
    return out


def trainables_line(root: Path) -> str:
    path = root / "lora" / "trainables.safetensors"
    if not path.is_file():
        return "trainables: not written yet\n"
    digest = sha256(path)
    return f"trainables: {path} ({path.stat().st_size / 2**20:.1f} MiB), sha256 {digest}\n"


def summary(root: Path, trained: int) -> str:
    """The whole summary.md text."""
    if not root.is_dir():
        raise MissingInput(f"--root {root}: no such folder; run the study first (evalm run --config "
                           "configs/study-summaries.toml)")
    ppl_text, ppl = ppl_table(root)
    recall_text, cells = recall_table(root)
    icl_text, icl = icl_table(root)
    return "\n".join([f"# Study: EVA's summaries on a converted model ({root})", "", "## Goals", "",
                      *goals(ppl, cells, icl, trained), "", trainables_line(root), "## Perplexity by position", "",
                      ppl_text, "## Recall", "", recall_text, "## ICL", "", icl_text,
                      "## What the summaries carry, per layer", "", probe_table(root)])


def main(argv: Sequence[str] | None = None) -> int:
    p = Parser(prog="evalm study summary", description=__doc__.split("\n")[0])
    p.add_argument("--root", type=Path, required=True, help="the study's folder (required)")
    p.add_argument("--trained-length", type=int, default=8192, help="the converted model's trained length: the goals' "
                   "buckets are [L/2, L) and recall at 2L (default: 8192, SmolLM2's)")
    args = p.parse_args(list(argv if argv is not None else sys.argv[1:]))
    text = summary(args.root, args.trained_length)
    write_atomic(args.root / "summary.md", text)
    print(text)
    return 0
