"""Incremental encoding through the cache: memory vs context length, and scoring time vs shots.

Run: python benchmarks/incremental.py [--config configs/pretrain-tiny.toml] [--max-tokens 262144]
         [--score-configs configs/pretrain-tiny.toml configs/evalm-350m.toml] [--reencode-items 3]

1. Encodes one random 262,144-token stream with the tiny EVA model in 8,192-token segments and
   prints, at 16k … 256k, the cache's bytes, what a full K/V cache of the same model would hold
   (2 · n_layer · n · d_model values), their ratio, and the process's peak RSS. Goal:
   linear growth, cache ≤ full / chunk_size + the window.
2. For each model of --score-configs (random weights: the tiny one and the EVALM-350M shape,
   all 24 layers), encodes 16 and 2,000 demonstrations once, then scores test inputs by
   forking the cache, and prints the time per test input at each and their ratio (goal ≤ 1.5),
   with the re-encoding baseline (no cache reuse) beside it.
"""

from __future__ import annotations

import random
import statistics
import time

import torch

import timing
from evalm.config_toolkit import build, read_toml
from evalm import EvalmModel, ModelConfig


def tiny_model(path: str) -> EvalmModel:
    """The [model] of a config file with random weights, dropout off, in eval mode."""
    config = build(ModelConfig, {**read_toml(path)["model"], "dropout": 0.0, "attn_dropout": 0.0}, where=f"{path} [model]")
    torch.manual_seed(0)
    model = EvalmModel(config)
    model.init_weights()
    return model.eval()


@torch.no_grad()
def memory_vs_length(model: EvalmModel, max_tokens: int, segment: int) -> None:
    cfg = model.config
    marks = [n for n in (16384, 32768, 65536, 131072, 262144) if n <= max_tokens]
    print(f"== cache memory vs context length ({cfg.attention}, d_model={cfg.d_model}, n_layer={cfg.n_layer}, "
          f"window={cfg.window_size}, chunk={cfg.chunk_size}; full K/V computed as 2·n_layer·n·d_model·4 bytes)")
    print(f"{'tokens':>8} {'cache MiB':>10} {'full K/V MiB':>13} {'full/cache':>11} {'bound MiB':>10} {'peak RSS MiB':>13} {'s':>7}")
    stream = torch.randint(0, cfg.vocab_size, (1, max_tokens), generator=torch.Generator().manual_seed(0))
    cache, t0 = model.new_cache(), time.perf_counter()
    for start in range(0, max_tokens, segment):
        model(stream[:, start : start + segment], cache=cache)
        n = cache.n_seen
        if n in marks:
            full = 2 * cfg.n_layer * n * cfg.d_model * 4
            window = 2 * cfg.n_layer * (cfg.window_size * (2 if cfg.overlap_window else 1) + cfg.chunk_size) * cfg.d_model * 4
            bound = full / cfg.chunk_size + window
            print(f"{n:>8} {cache.nbytes() / 2**20:>10.2f} {full / 2**20:>13.1f} {full / cache.nbytes():>10.2f}x "
                  f"{bound / 2**20:>10.2f} {timing.status_mib('VmHWM'):>13.0f} {time.perf_counter() - t0:>7.1f}", flush=True)


@torch.no_grad()
def scoring_time(model: EvalmModel, shots: list[int], n_items: int, demo_tokens: tuple[int, int] = (8, 14),
                 reencode_items: int = 3) -> None:
    """Median time to score one test input (2 candidates, batched forks) at each shot count.

    The demonstration caches are built first; the test inputs are then timed interleaved across
    shot counts, after a warm-up round, so machine noise and thread-pool start-up hit every shot
    count alike. The re-encoding baseline (no cache reuse) runs the whole prompt for
    `reencode_items` items.
    """
    rng = random.Random(0)
    V = model.config.vocab_size
    demo = lambda: [rng.randrange(V) for _ in range(rng.randint(*demo_tokens))]  # noqa: E731
    tests = [torch.tensor([[rng.randrange(V) for _ in range(12)], [rng.randrange(V) for _ in range(12)]]) for _ in range(n_items)]
    prefixes, caches = {}, {}
    for k in shots:
        prefixes[k] = torch.tensor([sum((demo() for _ in range(k)), [])])
        caches[k] = model.new_cache()
        model(prefixes[k], cache=caches[k])
    times = {k: [] for k in shots}
    for i, cand in enumerate([tests[0]] * 3 + tests):
        for k in shots:
            t0 = time.process_time()  # CPU time at one thread: other processes' load hardly moves it
            model(cand, cache=caches[k].fork(batch_size=2))
            if i >= 3:  # the first three rounds are warm-up
                times[k].append(time.process_time() - t0)
    cfg = model.config
    print(f"== time per test input (2 candidates of 12 tokens, batched forks) vs demonstrations (d_model={cfg.d_model}, "
          f"n_layer={cfg.n_layer}, n_head={cfg.n_head}, window={cfg.window_size}, chunk={cfg.chunk_size})")
    print(f"{'shots':>6} {'demo tokens':>12} {'reuse ms':>9} {'re-encode ms':>13} {'cache KiB':>10}   (CPU ms, median)")
    rows = {}
    for k in shots:
        reencode = []
        for cand in tests[:reencode_items]:
            t0 = time.process_time()
            model(torch.cat([prefixes[k].expand(2, -1), cand], 1))
            reencode.append(time.process_time() - t0)
        rows[k] = statistics.median(times[k])
        slow = statistics.median(reencode) * 1e3 if reencode else float("nan")
        print(f"{k:>6} {prefixes[k].shape[1]:>12} {rows[k] * 1e3:>9.2f} {slow:>13.1f} "
              f"{caches[k].nbytes() / 1024:>10.0f}", flush=True)
    lo, hi = min(shots), max(shots)
    print(f"time per test input, {hi} vs {lo} shots, with cache reuse: {rows[hi] / rows[lo]:.2f}x (goal <= 1.5x)")


def main(config: str = "configs/pretrain-tiny.toml", max_tokens: int = 262144, segment: int = 8192,
         score_configs: list[str] = ("configs/pretrain-tiny.toml", "configs/evalm-350m.toml"),
         shots: list[int] = (16, 2000), items: int = 30, demo_tokens: list[int] = (8, 14), reencode_items: int = 3,
         threads: int = 1) -> None:
    """`config`'s [model] encodes the stream (`max_tokens` 0 skips it), `segment` tokens a forward; each of
    `score_configs` is timed scoring, re-encoding (the no-reuse baseline) for the first only: at the 350M shape
    one 2,000-shot re-encoding takes minutes. One torch thread: on a shared machine wake-ups dominate tiny ops."""
    print(timing.machine())
    torch.set_num_threads(threads)
    for i, path in enumerate(score_configs):
        scoring_time(tiny_model(path), shots, items, tuple(demo_tokens), reencode_items if i == 0 else 0)
    if max_tokens:
        memory_vs_length(tiny_model(config), max_tokens, segment)


if __name__ == "__main__":
    raise SystemExit(timing.cli(main, __doc__))
