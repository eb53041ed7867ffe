"""SAICL's structured T5 encoder vs full attention (and FiD) as k grows: time and peak memory (SAICL Fig. 2).

Run: python benchmarks/saicl_t5.py [--shots 4 16 64 128] [--demo-tokens 32] [--d-model 256] [--layers 2]

Fake inputs as the paper's Fig. 2: k demonstrations of exactly L tokens and a test input of L
tokens, one prompt, inference (no grad), float32 on the CPU. Each (encoder, k) runs in its own
process, so its peak RSS above the process's start is its own; the ratios are full / saicl.
Full attention costs O(k²L²), SAICL and FiD O(kL²) (§3.2). The paper measured 3.4x at 64 shots
and 6.3x at 128 on an A6000 with T5-large; a tiny model on a shared CPU shows the shape, not those.
"""

from __future__ import annotations

import timing

KINDS = ("full", "saicl", "fid")


def measure(kind: str, k: int, d_model: int, layers: int, heads: int, demo_tokens: int, repeats: int) -> dict:
    """One child: a random T5 encoder, one prompt of k demos + test, min time over repeats, peak RSS."""
    import torch

    from evalm.icl_eval.models.t5 import T5Shape, encode, tiny_t5

    torch.manual_seed(0)
    lm = tiny_t5(shape=T5Shape(d_model=d_model, layers=layers, heads=heads, d_ff=2 * d_model))
    g = torch.Generator().manual_seed(1)
    demos = [[tuple(torch.randint(1, 256, (demo_tokens,), generator=g).tolist()) for _ in range(k)]]
    test = [tuple(torch.randint(1, 256, (demo_tokens,), generator=g).tolist())]
    start = timing.status_mib("VmRSS")
    with torch.no_grad():  # the warm-up at full size: allocator, thread pool
        seconds = timing.best_of(lambda: encode(lm.model, kind, demos, test, lm.pad_id), repeats)
    return {"seconds": seconds, "peak_mib": max(0.0, timing.status_mib("VmHWM") - start)}


def main(shots: list[int] = (4, 16, 32, 64, 128), demo_tokens: int = 32, d_model: int = 256, layers: int = 2,
         heads: int = 4, repeats: int = 3) -> None:
    print(timing.machine())
    print(f"L={demo_tokens} d_model={d_model} layers={layers}; time in ms (best of {repeats}), memory in MiB above start")
    print(f"{'k':>5} {'tokens':>7} {'full ms':>9} {'saicl ms':>9} {'fid ms':>8} {'speed-up':>9} "
          f"{'full MiB':>9} {'saicl MiB':>10} {'fid MiB':>8} {'mem ratio':>9}")
    for k in shots:
        f, s, d = (timing.child(__file__, "measure", kind, k, d_model, layers, heads, demo_tokens, repeats) for kind in KINDS)
        print(f"{k:>5} {(k + 1) * demo_tokens:>7} {1e3 * f['seconds']:>9.1f} {1e3 * s['seconds']:>9.1f} "
              f"{1e3 * d['seconds']:>8.1f} {timing.ratio(f['seconds'], s['seconds']):>9} {f['peak_mib']:>9.0f} "
              f"{s['peak_mib']:>10.0f} {d['peak_mib']:>8.0f} {timing.ratio(f['peak_mib'], max(s['peak_mib'], 1.0)):>9}",
              flush=True)


if __name__ == "__main__":
    raise SystemExit(timing.cli(main, __doc__, {"measure": measure}))
