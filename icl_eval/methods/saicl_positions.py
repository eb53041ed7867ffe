"""Why does the decoder adaptation of SAICL score below the other methods? An ablation on one model.

    evalm eval saicl-positions --checkpoint runs/tiny/export/msit --shots 1,4,16,64 --seeds 1,2,3

SAICL (its §3.2) encodes every demonstration as its own segment, right-aligned so that all of them
end just before the test input, and lets the test input attend to all of them. For a decoder tuned on
ordinary left-to-right contexts (the tiny run's EVA model) that changes two things at once:
- isolation: a demonstration no longer sees the earlier ones, and each starts with its own [bos];
- shared positions: all k demonstrations sit at the same positions, so the test input sees k tokens
  at every position it attends to, a layout the decoder never met in training.
This script scores, on the same synthetic episodes and demonstrations (accuracy over seeds):
`incremental` (ordinary context), `saicl` (both changes), `saicl + log k` (the test's own logits
raised by log k, as Structured Prompting does), and `isolated, sequential` (segments isolated as in
SAICL but each at the position it has in the ordinary context: only isolation changes). Comparing the
rows separates the two causes (docs/evaluation.md, "SAICL in a decoder").
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path


from evalm.io import load_model
from evalm.text.tokenizer import load_tokenizer
from evalm.icl_eval.models.lm import EvalmLM
from evalm.icl_eval.methods.decoder import METHODS, MethodOptions, score_after, encode, make_groups
from evalm.icl_eval.tasks.prompts import PromptBuilder
from evalm.icl_eval.protocol.selection import dataset_level
from evalm.icl_eval.tasks.synthetic import SyntheticConfig, episode, synthetic_task


def isolated_sequential(lm, prompt, demos, items, options: MethodOptions) -> list[list[float]]:
    """SAICL's isolated segments, each at its offset in the ordinary context (no shared positions)."""
    groups = make_groups(prompt, demos, options, one_per_demo=True)
    states, offset = [], 0
    for g in groups:
        states.append(encode(lm, g.tokens, offset, options.segment_tokens))
        offset += len(g.tokens)
    merged = lm.merge(states, own_logit_bias=0.0, position_offset=offset)
    return [score_after(lm, merged, item, options.scoring) for item in items]


def accuracy(scores, items) -> float:
    return sum(int(max(range(len(s)), key=s.__getitem__) == it.gold) for s, it in zip(scores, items)) / len(items)


def main(argv=None) -> int:
    from evalm.config_toolkit import Parser
    from evalm.config_toolkit.machine import torch_threads

    p = Parser(prog="evalm eval saicl-positions", description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", default="runs/tiny/export/msit", help="exported EVALM (default: the tiny run's tuned model)")
    p.add_argument("--shots", default="1,4,16,64", help="comma-separated shot counts (default 1,4,16,64)")
    p.add_argument("--seeds", default="1,2,3", help="comma-separated episode seeds (default 1,2,3)")
    p.add_argument("--template", default="{x} {label}", help="synthetic instance template (default '{x} {label}')")
    args = p.parse_args(argv)
    with torch_threads(1):  # one thread for this command, not left on the process
        ckpt = Path(args.checkpoint)
        lm = EvalmLM(load_model(ckpt), load_tokenizer(ckpt / "tokenizer.json"), name=str(ckpt))
        syn = SyntheticConfig(template=args.template)
        prompt = PromptBuilder(synthetic_task(syn), lm.tokenizer, "eos")
        plain = MethodOptions()
        variants = {
            "incremental": lambda d, it: METHODS["incremental"](lm, prompt, d, it, plain).scores,
            "saicl": lambda d, it: METHODS["saicl"](lm, prompt, d, it, plain).scores,
            "saicl + log k": lambda d, it: METHODS["saicl"](lm, prompt, d, it, MethodOptions(saicl_rescale=True)).scores,
            "isolated, sequential": lambda d, it: isolated_sequential(lm, prompt, d, it, plain),
        }
        shots = [int(k) for k in args.shots.split(",")]
        table = {name: {k: [] for k in shots} for name in variants}
        for seed in (int(s) for s in args.seeds.split(",")):
            splits = episode(seed, syn)
            demo_of = [prompt.demo(i, row) for i, row in enumerate(splits["train"])]
            for k in shots:
                demos = [demo_of[j] for j in dataset_level(len(splits["train"]), k, seed)]
                items = [prompt.test_item(i, row, k) for i, row in enumerate(splits["test"])]
                for name, fn in variants.items():
                    table[name][k].append(accuracy(fn(demos, items), items))
        print(f"model {ckpt}; synthetic family ({syn.n_inputs} inputs, {syn.n_labels} labels, chance "
              f"{1 / syn.n_labels:.2f}); accuracy, mean over seeds {args.seeds} x {syn.n_test} items")
        print(f"{'variant':>22} " + " ".join(f"{k:>7}" for k in shots))
        for name, row in table.items():
            print(f"{name:>22} " + " ".join(f"{statistics.fmean(row[k]):7.2f}" for k in shots))
    return 0


if __name__ == "__main__":
    sys.exit(main())
