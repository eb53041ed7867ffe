"""Incremental encoding through the cache: its memory vs context length.

Run: python benchmarks/incremental.py [--config configs/pretrain-tiny.toml] [--max-tokens 262144] [--segment 8192]

Encodes one random 262,144-token stream with the tiny EVA model in 8,192-token segments and prints, at
16k … 256k, the cache's bytes, what a full K/V cache of the same model would hold (2 · n_layer · n · d_model
values), their ratio, and the process's peak RSS. Goal: linear growth, cache ≤ full / chunk_size + the
window. Scoring time vs shots through the cache, tiny or at the 350M shape, is benchmarks/icl.py's.
"""

from __future__ import annotations

import time

import torch

import timing


@torch.no_grad()
def memory_vs_length(model, max_tokens: int, segment: int) -> None:
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


def main(config: str = "configs/pretrain-tiny.toml", max_tokens: int = 262144, segment: int = 8192,
         threads: int = 1) -> None:
    """One torch thread by default: on a shared machine thread wake-ups dominate tiny ops."""
    print(timing.machine())
    torch.set_num_threads(threads)
    memory_vs_length(timing.random_model(config), max_tokens, segment)


if __name__ == "__main__":
    raise SystemExit(timing.cli(main, __doc__))
