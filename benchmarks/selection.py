"""Selection inside EVA's memory (docs/eva.md, "Selection"): what it costs, as ratios measured in one process.

Run: python benchmarks/selection.py [--lengths 8192 32768] [--select 2] [--shots 16 256 2000] [--threads 1]

1. Forward + backward of one attention layer (d_model 256, 4 heads, window 128, chunk 8) on random inputs at
   each length: EVA with selection (k = --select) vs EVA vs exact attention, CPU seconds (median of --repeats).
   Goals: selection ≥ 0.8× EVA's speed at 8k, ≥ 3× exact attention's at 32k.
2. A one-layer model of the same shape after 16 / 256 / 2,000 demonstrations (8-14 random tokens each)
   encoded once: the cache's bytes and the CPU time to score one test item (2 candidates of 12 tokens,
   batched forks), EVA with selection vs EVA vs full attention's K/V cache. Goal: selection's time at 2,000
   shots ≤ 1.5× its time at 16.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from evalm import EvalmModel, ModelConfig
from evalm.attention import attention_class
from evalm.config_toolkit.machine import device_name

SHAPE = dict(vocab_size=512, d_model=256, n_layer=1, n_head=4, d_ff=1024, window_size=128, chunk_size=8,
             dropout=0.0, attn_dropout=0.0)
KINDS = {"EVA + selection": ("eva", True), "EVA": ("eva", False), "exact": ("full", False)}


def config(kind: str, k: int) -> ModelConfig:
    attention, select = KINDS[kind]
    return ModelConfig(**SHAPE, attention=attention, select_chunks=k if select else 0)


def cpu_seconds(step, repeats: int) -> float:
    step()  # warm-up: allocator and thread pool
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        step()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def training_cost(lengths: list[int], k: int, repeats: int) -> None:
    print(f"== forward + backward, one attention layer (d_model 256, 4 heads, w 128, c 8, k {k}), CPU s")
    print(f"{'tokens':>7} " + " ".join(f"{kind:>16}" for kind in KINDS) + f" {'sel / EVA speed':>16} {'sel / exact speed':>18}")
    for n in lengths:
        row = {}
        for kind in KINDS:
            torch.manual_seed(0)
            layer = attention_class(KINDS[kind][0])(config(kind, k), 0)
            layer.init_weights()
            x = torch.randn(1, n, SHAPE["d_model"], requires_grad=True)
            row[kind] = cpu_seconds(lambda: layer(x).square().mean().backward(), repeats)
        sel = row["EVA + selection"]
        print(f"{n:>7} " + " ".join(f"{row[kind]:>16.2f}" for kind in KINDS) +
              f" {row['EVA'] / sel:>15.2f}x {row['exact'] / sel:>17.2f}x", flush=True)


@torch.no_grad()
def scoring_cost(shots: list[int], k: int, items: int) -> None:
    print(f"== one test item (2 candidates of 12 tokens, batched forks) after N demonstrations; cache MiB, CPU ms (median of {items})")
    rng = random.Random(0)
    demos = [[rng.randrange(SHAPE["vocab_size"]) for _ in range(rng.randint(8, 14))] for _ in range(max(shots))]
    tests = [torch.randint(0, SHAPE["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(i)) for i in range(items)]
    print(f"{'kind':>16} " + " ".join(f"{f'{s} MiB':>9} {f'{s} ms':>9}" for s in shots) + f" {'ms ratio':>9}")
    for kind in KINDS:
        torch.manual_seed(0)
        model = EvalmModel(config(kind, k))
        model.init_weights()
        model.eval()
        cells, ms = [], {}
        for s in shots:
            cache = model.new_cache()
            for demo in demos[:s]:  # one demonstration at a time, as the incremental method reads them
                model(torch.tensor([demo]), cache=cache)
            ms[s] = 1e3 * statistics.median(cpu_seconds(lambda: model(t, cache=cache.fork(batch_size=2)), 1)
                                            for t in tests)
            cells.append(f"{cache.nbytes() / 2**20:>9.2f} {ms[s]:>9.2f}")
        print(f"{kind:>16} " + " ".join(cells) + f" {ms[max(shots)] / ms[min(shots)]:>8.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="*", default=[8192, 32768], help="training lengths (default 8192 32768)")
    parser.add_argument("--select", type=int, default=2, help="k, the chunks each query selects (default 2)")
    parser.add_argument("--shots", type=int, nargs="*", default=[16, 256, 2000], help="cached demonstrations (default 16 256 2000)")
    parser.add_argument("--items", type=int, default=10, help="test items timed per shot count (default 10)")
    parser.add_argument("--repeats", type=int, default=3, help="timed forward + backward passes per cell (default 3)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"CPU: {device_name()}, {args.threads} thread(s), torch {torch.__version__}")
    if args.lengths:
        training_cost(args.lengths, args.select, args.repeats)
    if args.shots:
        scoring_cost(args.shots, args.select, args.items)


if __name__ == "__main__":
    main()
