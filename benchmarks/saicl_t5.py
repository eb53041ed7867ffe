"""SAICL's structured T5 encoder vs full attention (and FiD) as k grows: time and peak memory (SAICL Fig. 2).

Run: python benchmarks/saicl_t5.py [--shots 4 16 64 128] [--demo-tokens 32] [--d-model 256] [--layers 2]

Fake inputs as the paper's Fig. 2: k demonstrations of exactly L tokens and a test input of L
tokens, one prompt, inference (no grad), float32 on the CPU. Each (encoder, k) runs in its own
process, so its peak RSS above the process's start is its own; the ratios are full / saicl.
Full attention costs O(k²L²), SAICL and FiD O(kL²) (§3.2). The paper measured 3.4x at 64 shots
and 6.3x at 128 on an A6000 with T5-large; a tiny model on a shared CPU shows the shape, not those.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

KINDS = ("full", "saicl", "fid")


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def measure(kind: str, k: int, d_model: int, layers: int, heads: int, demo_tokens: int, repeats: int) -> dict:
    """One child: a random T5 encoder, one prompt of k demos + test, min time over repeats, peak RSS."""
    import torch

    from evalm.config_toolkit.machine import peak_rss_gib
    from evalm.icl_eval.models.t5 import T5Shape, encode, tiny_t5

    torch.manual_seed(0)
    lm = tiny_t5(shape=T5Shape(d_model=d_model, layers=layers, heads=heads, d_ff=2 * d_model))
    g = torch.Generator().manual_seed(1)
    demos = [[tuple(torch.randint(1, 256, (demo_tokens,), generator=g).tolist()) for _ in range(k)]]
    test = [tuple(torch.randint(1, 256, (demo_tokens,), generator=g).tolist())]
    start = _rss_mib()
    with torch.no_grad():
        encode(lm.model, kind, demos, test, lm.pad_id)  # warm-up at full size (allocator, thread pool)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            encode(lm.model, kind, demos, test, lm.pad_id)
            times.append(time.perf_counter() - t0)
    peak = peak_rss_gib() * 1024
    return {"seconds": min(times), "peak_mib": max(0.0, peak - start)}


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shots", type=int, nargs="+", default=[4, 16, 32, 64, 128], help="k (default 4..128)")
    parser.add_argument("--demo-tokens", type=int, default=32, help="L, tokens per demonstration and test (32)")
    parser.add_argument("--d-model", type=int, default=256, help="model width (256)")
    parser.add_argument("--layers", type=int, default=2, help="encoder layers (2)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (4)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per point; the minimum is kept (3)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], int(args.child[1]), args.d_model, args.layers, args.heads, args.demo_tokens, args.repeats)))
        return
    flags = ["--demo-tokens", str(args.demo_tokens), "--d-model", str(args.d_model), "--layers", str(args.layers),
             "--heads", str(args.heads), "--repeats", str(args.repeats)]
    print(f"L={args.demo_tokens} d_model={args.d_model} layers={args.layers}; time in ms, memory in MiB above start")
    print(f"{'k':>5} {'tokens':>7} {'full ms':>9} {'saicl ms':>9} {'fid ms':>8} {'speed-up':>9} "
          f"{'full MiB':>9} {'saicl MiB':>10} {'fid MiB':>8} {'mem ratio':>9}")
    for k in args.shots:
        row = {}
        for kind in KINDS:
            out = subprocess.run([sys.executable, __file__, "--child", kind, str(k), *flags], check=True,
                                 capture_output=True, text=True).stdout
            row[kind] = json.loads(out.strip().splitlines()[-1])
        f, s, d = row["full"], row["saicl"], row["fid"]
        print(f"{k:>5} {(k + 1) * args.demo_tokens:>7} {1e3 * f['seconds']:>9.1f} {1e3 * s['seconds']:>9.1f} "
              f"{1e3 * d['seconds']:>8.1f} {f['seconds'] / s['seconds']:>8.2f}x {f['peak_mib']:>9.0f} "
              f"{s['peak_mib']:>10.0f} {d['peak_mib']:>8.0f} {f['peak_mib'] / max(s['peak_mib'], 1.0):>8.2f}x",
              flush=True)


if __name__ == "__main__":
    main()
