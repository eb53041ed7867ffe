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

import random
import statistics
import time

import timing
import torch

from evalm import ModelConfig
from evalm.attention import attention_class

SHAPE = dict(vocab_size=512, d_model=256, n_layer=1, n_head=4, d_ff=1024, window_size=128, chunk_size=8,
             dropout=0.0, attn_dropout=0.0)
KINDS = {"EVA + selection": ("eva", True), "EVA": ("eva", False), "exact": ("full", False)}


def cpu_seconds(step, repeats: int) -> float:
    """CPU seconds of one step, the median of `repeats` after a warm-up: others' load hardly moves it."""
    return timing.best_of(step, repeats, clock=time.process_time, pick=statistics.median)


def training_cost(lengths: list[int], k: int, repeats: int) -> None:
    print(f"== forward + backward, one attention layer (d_model 256, 4 heads, w 128, c 8, k {k}), CPU s")
    print(f"{'tokens':>7} " + " ".join(f"{kind:>16}" for kind in KINDS) + f" {'sel / EVA speed':>16} {'sel / exact speed':>18}")
    for n in lengths:
        row = {}
        for kind in KINDS:
            attention, select = KINDS[kind]
            torch.manual_seed(0)
            layer = attention_class(attention)(ModelConfig(**SHAPE, attention=attention, select_chunks=k * select), 0)
            layer.init_weights()
            x = torch.randn(1, n, SHAPE["d_model"], requires_grad=True)
            row[kind] = cpu_seconds(lambda: layer(x).square().mean().backward(), repeats)
        sel = row["EVA + selection"]
        print(f"{n:>7} " + " ".join(f"{row[kind]:>16.2f}" for kind in KINDS) +
              f" {timing.ratio(row['EVA'], sel):>16} {timing.ratio(row['exact'], sel):>18}", flush=True)


@torch.no_grad()
def scoring_cost(shots: list[int], k: int, items: int) -> None:
    print(f"== one test item (2 candidates of 12 tokens, batched forks) after N demonstrations; cache MiB, CPU ms (median of {items})")
    rng = random.Random(0)
    demos = [[rng.randrange(SHAPE["vocab_size"]) for _ in range(rng.randint(8, 14))] for _ in range(max(shots))]
    tests = [torch.randint(0, SHAPE["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(i)) for i in range(items)]
    print(f"{'kind':>16} " + " ".join(f"{f'{s} MiB':>9} {f'{s} ms':>9}" for s in shots) + f" {'ms ratio':>9}")
    for kind in KINDS:
        attention, select = KINDS[kind]
        model = timing.random_model(SHAPE, attention=attention, select_chunks=k * select)
        cells, ms = [], {}
        for s in shots:
            cache = model.new_cache()
            for demo in demos[:s]:  # one demonstration at a time, as the incremental method reads them
                model(torch.tensor([demo]), cache=cache)
            ms[s] = 1e3 * statistics.median(cpu_seconds(lambda: model(t, cache=cache.fork(batch_size=2)), 1)
                                            for t in tests)
            cells.append(f"{cache.nbytes() / 2**20:>9.2f} {ms[s]:>9.2f}")
        print(f"{kind:>16} " + " ".join(cells) + f" {timing.ratio(ms[max(shots)], ms[min(shots)]):>9}", flush=True)


def main(lengths: list[int] = (8192, 32768), select: int = 2, shots: list[int] = (16, 256, 2000), items: int = 10,
         repeats: int = 3, threads: int = 1) -> int:
    torch.set_num_threads(threads)
    print(f"{timing.machine()}; {threads} torch thread(s), torch {torch.__version__}")
    if lengths:
        training_cost(list(lengths), select, repeats)
    if shots:
        scoring_cost(list(shots), select, items)
    return 0


if __name__ == "__main__":
    raise SystemExit(timing.cli(main, __doc__))
