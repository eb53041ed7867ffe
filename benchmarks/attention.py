"""EVA vs exact attention, forward + backward, on the CPU: time and peak memory, as ratios.

Run: python benchmarks/attention.py [--lengths 2048 8192 32768] [--repeats 2]
Shapes of EVA_SPEC §2's measurements: d_model 256, 4 heads, window 128, chunk 8. Each
(method, length) runs in its own process so its peak RSS is its own; the ratio is full / EVA.
Goal (issue 2): EVA at least 1.5x faster at 8k and 3x at 32k.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def measure(method: str, length: int, repeats: int) -> dict:
    """One child process: build the layer, time forward+backward, report peak memory above start."""
    import torch

    from evalm import ModelConfig
    from evalm.model import ATTENTION

    torch.manual_seed(0)
    config = ModelConfig(d_model=256, n_head=4, window_size=128, chunk_size=8, attention=method,
                         dropout=0.0, attn_dropout=0.0, n_layer=1, vocab_size=8, d_ff=8)
    layer = ATTENTION[method](config)
    layer.init_weights()
    x = torch.randn(1, length, 256, requires_grad=True)
    start = _rss_mib()
    layer(x).sum().backward()  # warm-up at full size: allocator, kernels, thread pool (not timed)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        layer(x).sum().backward()
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": min(times), "peak_mib": max(0.0, peak - start)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192, 32768])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], int(args.child[1]), args.repeats)))
        return
    print(f"{'tokens':>7} {'full s':>8} {'eva s':>8} {'speed-up':>9} {'full MiB':>9} {'eva MiB':>8} {'mem ratio':>9}")
    for n in args.lengths:
        row = {}
        for method in ("full", "eva"):
            out = subprocess.run([sys.executable, __file__, "--repeats", str(args.repeats), "--child", method, str(n)],
                                 capture_output=True, text=True, check=True)
            row[method] = json.loads(out.stdout.strip().splitlines()[-1])
        f, e = row["full"], row["eva"]
        print(f"{n:>7} {f['seconds']:>8.3f} {e['seconds']:>8.3f} {f['seconds'] / e['seconds']:>8.2f}x "
              f"{f['peak_mib']:>9.0f} {e['peak_mib']:>8.0f} {f['peak_mib'] / max(e['peak_mib'], 1):>8.2f}x", flush=True)


if __name__ == "__main__":
    main()
