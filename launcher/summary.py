"""`summary.md`: the run's report as a person reads it, every number beside its baseline.

Accuracies are printed with their 95% hierarchical bootstrap interval and the label baselines of
the same items; the headline is the gain over the best baseline. Perplexities stand beside the
uniform and unigram references, and the context effect is read from the fixed-position protocol,
not from position buckets (docs/evaluation.md). Numbers are rounded to what their intervals support.
"""

from __future__ import annotations

from typing import Any

from evalm.config_toolkit.markdown import markdown


def _ci(c) -> str:
    return f"[{c[0]:.2f}, {c[1]:.2f}]"


def _run_lines(results: dict) -> list[str]:
    totals, inv = results["run_totals"], results["this_invocation"]
    lines = [f"# EVALM run: {results['run']['folder']}", "",
             f"Config `{results['run']['config']}`; samples `{results['run']['samples']}`.", "",
             f"Whole run (from the stage markers): {totals['seconds']:.0f} s of stage steps"
             + (f" (up to {totals['jobs']} at once: more than the wall time)" if totals.get("jobs", 1) > 1 else "")
             + ", peak RSS of the largest process "
             f"{totals['peak_rss_gib']:.2f} GiB. This invocation: {inv['wall_seconds']:.0f} s wall, peak RSS "
             f"{inv['peak_rss_gib']:.2f} GiB, stages run: {', '.join(inv['stages_run']) or 'none (all complete)'}.",
             "", "## Stages", ""]
    return lines + markdown(["stage", "seconds"], [[stage, f"{sec:.0f}"] for stage, sec in totals["stage_seconds"].items()]).splitlines()


def _icl_lines(name: str, models: dict[str, Any]) -> list[str]:
    first = next(iter(models.values()))
    proto, ev = first["protocol"], first["protocol"]["eval"]
    items = ev.get("test_items") or "all"
    lines = ["", f"## ICL: {name}", "",
             f"Task `{proto['task']}`, template `{proto['template']}`, scoring `{proto['scoring']}`, separator "
             f"`{ev['separator']}`, seeds {list(ev['seeds'])}, {items} test items per seed ({ev['test_items_order']}). "
             "Accuracy: mean over seeds [95% hierarchical bootstrap over seeds and items]; baselines on the same "
             "items and demonstrations; gain = accuracy - best baseline, paired.", ""]
    rows = [[model, method, k, f"{c['accuracy_mean']:.2f} {_ci(c['accuracy_ci95'])}", f"{c['baselines']['chance']['mean']:.2f}",
             f"{c['baselines']['test_majority']['mean']:.2f}", f"{c['baselines']['in_context_majority']['mean']:.2f}",
             f"{c['gain']['mean']:+.2f} {_ci(c['gain']['ci95'])}"]
            for model, block in models.items() for method, cells in block["summary"]["test"].items()
            for k, c in sorted(cells.items(), key=lambda kv: int(kv[0]))]
    header = ["model", "method", "shots", "accuracy", "chance", "test majority", "in-context majority",
              "gain over best baseline"]
    lines += [*markdown(header, rows).splitlines(), ""]
    for model, block in models.items():
        h = block["headline"][next(iter(block["headline"]))]
        verdict = "above" if h["gain_ci95"][0] > 0 else "NOT above"
        lines.append(f"- **{model}**, {h['method']} at {h['shots']} shots: {h['accuracy']:.2f} "
                     f"{_ci(h['accuracy_ci95'])}, {h['gain']:+.2f} {_ci(h['gain_ci95'])} over the best label baseline "
                     f"({h['over']}, {h['baselines'][h['over']]:.2f}): {verdict} every label baseline.")
    return lines + _diagnostic_lines(models) + ["", f"![accuracy vs shots](icl_{name}_accuracy_vs_shots.png)"]


def _diagnostic_lines(models: dict[str, Any]) -> list[str]:
    """Order and nearest-demonstration diagnostics: the spread over orders beside the spread over
    draws, and each arm's paired difference to the main order / full context on the same draws."""
    lines = []
    for model, block in models.items():
        for method, cells in block["summary"]["test"].items():
            for k, c in sorted(cells.items(), key=lambda kv: int(kv[0])):
                if "order_split" in c:
                    o = c["order_split"]
                    lines.append(f"- **{model}** {method} at {k}: spread over {o['n_orders']} orders of the same "
                                 f"demonstrations {o['order_std']:.3f} {_ci(o['order_std_ci95'])} vs over "
                                 f"{o['n_draws']} draws {o['draw_std']:.3f} {_ci(o['draw_std_ci95'])} (std of accuracy).")
                if "vs_base" in c:
                    d = c["vs_base"]
                    lines.append(f"- **{model}** {method} at {k}: {d['mean']:+.3f} {_ci(d['ci95'])} against the main "
                                 "order with the full context, paired on the same draws and items.")
    return ["", *lines] if lines else []


def _ppl_lines(ppl: dict[str, Any], train_length) -> list[str]:
    lines = ["", "## Perplexity vs context length", "",
             "Overall, every token of the books scored once (`cached`: with its whole prefix through the cache):", ""]
    refs, rows = {}, []
    for model, res in ppl.items():
        for name, p in res["protocols"].items():
            o = p["overall"]
            word = f"{o['word_ppl']:,.0f}" if o.get("word_ppl") else "-"
            rows.append([model, name, f"{o['tokens']:,}", f"{o['token_ppl']:.1f}", f"{o['bits_per_byte']:.3f}", word])
        refs = refs or res.get("references", {})
    rows += [["reference", name, f"{p['overall']['tokens']:,}", f"{p['overall']['token_ppl']:.1f}",
              f"{p['overall']['bits_per_byte']:.3f}", f"{p['overall']['word_ppl']:,.0f}"] for name, p in refs.items()]
    lines += markdown(["model", "protocol", "tokens", "token ppl", "bits per byte", "word ppl"], rows).splitlines()
    fixed = {m: r["fixed_position"] for m, r in ppl.items() if "fixed_position" in r}
    if fixed:
        first = next(iter(fixed.values()))
        contexts = [row["context"] for row in first["rows"]]
        lines += ["", f"Context use at fixed positions: the same {first['protocol']['targets']} target spans of "
                      f"{first['protocol']['target_tokens']} tokens after contexts of increasing length"
                      + (f" (training length {train_length})" if train_length else "") + "; token perplexity:", ""]
        rows = [[model, *(f"{row['token_ppl']:.1f}" for row in f["rows"])] for model, f in fixed.items()]
        rows.append(["references", ", ".join(f"{k} {v['token_ppl']:.1f}" for k, v in first["references"].items()),
                     *[""] * (len(contexts) - 1)])
        lines += markdown(["model", *map(str, contexts)], rows).splitlines()
        lines += ["", f"Perplexity relative to the {contexts[0]}-token context on the same spans (paired 95% "
                      "bootstrap interval over spans; below 1 means the longer context helps):", ""]
        lines += markdown(["model", *map(str, contexts[1:])],
                          [[model, *map(_ratio_cell, f["rows"][1:])] for model, f in fixed.items()]).splitlines()
    return lines + ["", "![perplexity vs length](perplexity_vs_length.png)"]


def _ratio_cell(row: dict) -> str:
    vs = row.get("vs_shortest")
    if not vs:  # results written before the paired comparison existed
        return "-"
    lo, hi = vs["ppl_ratio_ci95"]
    return f"{vs['ppl_ratio']:.3f} [{lo:.3f}, {hi:.3f}]"


RECALL_NOTE = ("Why this line: it runs every model's cache through prompts of up to 16x its training length, end "
               "to end; models pretrained for seconds are not expected to find the pass key (0.00 is the usual "
               "reading), and what EVA's summaries recall is the trained study's finding (docs/findings.md).")
"""Said under the main job's recall line: what it shows and what it does not."""


def summary_markdown(results: dict) -> str:
    lines = _run_lines(results)
    for name, models in results["icl"].items():
        lines += _icl_lines(name, models)
    if results["ppl"]:
        lines += _ppl_lines(results["ppl"], results.get("pretrain_seq_len"))
    if results.get("recall"):
        lines += ["", "## Recall through the cache (`evalm eval recall`; accuracy, mean over depths)", "",
                  results["recall"]["line"], "", RECALL_NOTE]
    return "\n".join(lines) + "\n"
