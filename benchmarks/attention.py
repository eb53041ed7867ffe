"""EVA vs exact attention through the model API, forward + backward on the CPU: time, peak live
memory and the FLOP limit, as same-run ratios with a verdict per target. No GPU figures (benchmarks/gpu.py).

Run: python benchmarks/attention.py [--rows attn block] [--lengths 8192 32768] [--dropout-lengths 8192]
         [--dropout-eva-lengths 32768] [--bf16-lengths 8192] [--models tiny 350m] [--model-length 8192] [--repeats 2]

Rows (each one module as a user builds it, `ModelConfig` then the module, fwd + bwd of its sum or loss):
  attn    one attention layer (q/k/v/out projections included) at d_model 256, 4 heads, window
          128, chunk 8 (the EVA LM recipe), fp32, attention dropout 0;
  block   one pre-LN `Block` at that shape with its MLP (d_ff = 4·d_model): the speed targets are read here;
  drop    `attn` at the paper's attention dropout 0.1, training mode: exact attention, EVA on its fused path
          (dropout as −inf in the kernel's mask, regenerated in backward) and EVA on the plain-PyTorch path
          ("eva-plain", the same hashed mask), side by side with their ratios;
  dropeva `drop` without exact attention, for lengths where its (n, n) probabilities and their dropout mask
          do not fit in memory (17 GB each at 32k): EVA fused vs EVA plain path;
  bf16    `block` under bf16 autocast (EVA's fused path takes bf16 inputs);
  tiny, 350m  the whole model (embeddings, one block, LM head, loss) at the shape of configs/pretrain-tiny.toml
          or configs/evalm-350m.toml with n_layer = 1, bf16 autocast where the CPU has AVX512-BF16.

Time: every (row, method) runs in its own process, full and EVA alternating over the repeats, the best of
each kept; a process makes one full-size warm-up pass, then times one pass in CPU seconds at one torch
thread (others' load stretches wall time much more than CPU time; both are printed).

Memory: live bytes at the peak, from torch's profiler (`profile_memory=True`) in a separate process: the
largest running total of bytes allocated inside the pass, i.e. the tensors it allocates and holds at once
(activations, saved tensors, gradients), not the parameters and inputs made before it nor the allocator's
fragmentation (tracemalloc cannot see torch's allocations; RSS mixes in glibc's caching). A 512-token
warm-up pass runs first so lazily initialised state is not counted.

FLOP limit: the ratio of the two methods' forward multiply-adds, the speed-up EVA could reach at the same
FLOP rate. Exact attention: 2·E·n(n+1)/2 for QKᵀ and PV (causal); EVA: 2·E·Σ_i (|L(i)| + |R(i)|), its local
block and visible chunks; both plus 4·n·E² projections, 2·n·E·d_ff MLP and n·E·V LM head where present (2
FLOPs a multiply-add; backward costs about twice the forward in both). A target above it cannot be met by
any kernel; the verdict says so.
"""

from __future__ import annotations

import json
import os
import tempfile
import time

import timing

LAYER = dict(d_model=256, n_head=4, window_size=128, chunk_size=8, n_layer=1, vocab_size=8, d_ff=1024)
MODELS = {"tiny": "configs/pretrain-tiny.toml", "350m": "configs/evalm-350m.toml"}
TARGET_SPEEDUP = {8192: 3.5, 32768: 5.5}  # attn and block rows: one layer through the model API
MEMORY_TARGET_LENGTHS = (8192, 32768)  # EVA's peak live bytes <= exact attention's
DROPOUT_ROWS = ("drop", "dropeva")  # attention dropout 0.1, training mode


def bf16_supported() -> bool:
    with open("/proc/cpuinfo") as f:
        return "avx512_bf16" in f.read()


def _config(variant: str, method: str):
    """The ModelConfig of a row ("proj": the projections alone, built from exact attention's)."""
    from evalm import ModelConfig
    from evalm.config_toolkit import build, read_toml

    method = {"proj": "full", "eva-plain": "eva"}.get(method, method)
    if variant in MODELS:
        fields = {**read_toml(MODELS[variant])["model"], "n_layer": 1}
        return build(ModelConfig, {**fields, "attention": method, "dropout": 0.0, "attn_dropout": 0.0}, where=MODELS[variant])
    return ModelConfig(**LAYER, attention=method, dropout=0.0, attn_dropout=0.1 if variant in DROPOUT_ROWS else 0.0)


def _build(variant: str, method: str):
    """(module, make, dtype): make(length) allocates that many tokens of input and returns one
    forward + backward step over them."""
    import torch

    from evalm import EvalmModel
    from evalm.attention import attention_class
    from evalm.model import Block

    torch.manual_seed(0)
    config = _config(variant, method)
    low = variant in ("bf16", *MODELS) and bf16_supported()
    if variant in MODELS:
        module = EvalmModel(config)
        module.init_weights()
    elif variant in ("block", "bf16"):
        module = Block(config, 0)
        module.attn.init_weights()
    elif method == "proj":  # the layer's four projections alone: what EVA and exact attention share
        module = attention_class("full")(config)
        module.init_weights()

        def projections(x):
            return module.out_proj(module.q_proj(x) + module.k_proj(x) + module.v_proj(x))

        module.forward = projections
    else:
        module = attention_class(config.attention)(config)
        module.init_weights()
    module.train(variant in DROPOUT_ROWS)

    def make(length: int):
        if variant in MODELS:
            tokens = torch.randint(0, config.vocab_size, (1, length + 1))

            def loss():
                return module(tokens[:, :-1], targets=tokens[:, 1:])
        else:
            x = torch.randn(1, length, config.d_model, requires_grad=True)

            def loss():
                return module(x).float().sum()

        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=low):
                out = loss()
            out.backward()

        return step

    return module, make, "bf16" if low else "fp32"


def _peak_live_bytes(step) -> int:
    """Peak of the allocator's running total during step() (module docstring, "Memory")."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    totals = [e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]"]
    return max(totals, default=0)


def measure(variant: str, method: str, length: int, mode: str) -> dict:
    """One child process: 'time' (a full-size warm-up, then one timed pass) or 'memory'; `eva-plain` routes
    every EVA call as if the fused kernel were unavailable (the plain recompute path, tests/evalm/paths.py)."""
    from contextlib import nullcontext

    import torch

    from tests.evalm.paths import PLAIN, forced

    torch.set_num_threads(1)
    with forced(**PLAIN) if method == "eva-plain" else nullcontext():
        module, make, dtype = _build(variant, method)
        if mode == "memory":
            make(512)()
            module.zero_grad(set_to_none=True)
            return {"live_mib": _peak_live_bytes(make(length)) / 2**20, "dtype": dtype}
        step = make(length)
        step()
        module.zero_grad(set_to_none=True)
        c0, w0 = time.process_time(), time.perf_counter()
        step()
    return {"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - w0, "dtype": dtype}


def compare(variant: str, length: int, repeats: int) -> dict:
    """Best CPU time and peak live MiB of each method, the methods alternating process by process;
    an attn row also times the projections alone (its `proj_s`), so the attention's own share is known."""
    runs = {"full": [], "eva": [], **({"eva-plain": []} if variant in DROPOUT_ROWS else {})}
    if variant == "dropeva":
        del runs["full"]
    shared = []
    for _ in range(repeats):
        for method in runs:
            runs[method].append(timing.child(__file__, "measure", variant, method, length, "time"))
        if variant == "attn":
            shared.append(timing.child(__file__, "measure", variant, "proj", length, "time")["cpu_s"])
    row = {"proj_s": min(shared)} if shared else {}
    for method, rs in runs.items():
        live = timing.child(__file__, "measure", variant, method, length, "memory")["live_mib"]
        row[method] = {"cpu_s": min(r["cpu_s"] for r in rs), "wall_s": min(r["wall_s"] for r in rs),
                       "live_mib": live, "dtype": rs[0]["dtype"]}
    row["flop_limit"] = flop_limit(variant, length)
    return row


def forward_flops(variant: str, method: str, n: int) -> float:
    """Forward FLOPs of one row (module docstring, "FLOP limit")."""
    from evalm.tiling import Tiling

    config = _config(variant, method)
    E = config.d_model
    flops = 4 * n * E * E  # q, k, v, out projections
    if variant not in ("attn", *DROPOUT_ROWS):
        flops += 2 * n * E * config.d_ff
    if variant in MODELS:
        flops += n * E * config.vocab_size
    if method == "full":
        keys = n * (n + 1) // 2
    else:
        keys = round(Tiling.of(config, config.head_dim).mean_keys(n) * n)
    return 2 * (flops + 2 * E * keys)


def flop_limit(variant: str, n: int) -> float:
    return forward_flops(variant, "full", n) / forward_flops(variant, "eva", n)


def attention_flop_limit(n: int) -> float:
    """The FLOP limit of the attention alone (projections excluded), at the layer rows' shape."""
    projections = 2 * 4 * n * LAYER["d_model"] ** 2
    return (forward_flops("attn", "full", n) - projections) / (forward_flops("attn", "eva", n) - projections)


def print_row(variant: str, length: int, row: dict) -> None:
    e = row["eva"]
    if "full" not in row:  # a dropeva row: EVA's two paths alone
        plain = row["eva-plain"]
        print(f"{'dropeva':>7} {e['dtype']:>5} {length:>6}: EVA fused {e['cpu_s']:.2f} s, plain path {plain['cpu_s']:.2f} s "
              f"({timing.ratio(plain['cpu_s'], e['cpu_s'])}); wall {e['wall_s']:.2f} / {plain['wall_s']:.2f} s; "
              f"peak live MiB {e['live_mib']:.1f} / {plain['live_mib']:.1f}", flush=True)
        return
    f = row["full"]
    print(f"{variant:>5} {e['dtype']:>5} {length:>6} {f['cpu_s']:>8.2f} {e['cpu_s']:>8.2f} {f['cpu_s'] / e['cpu_s']:>8.2f}x "
          f"{row['flop_limit']:>8.2f}x {f['wall_s']:>7.2f} {e['wall_s']:>7.2f} "
          f"{f['live_mib']:>9.1f} {e['live_mib']:>9.1f} {e['live_mib'] / f['live_mib']:>8.2f}x", flush=True)
    if "eva-plain" in row:
        print(f"{'':>5} {'':>5} {length:>6} {'plain path':>17} {row['eva-plain']['cpu_s']:>8.2f} "
              f"{f['cpu_s'] / row['eva-plain']['cpu_s']:>8.2f}x {'':>9} {'':>7} {row['eva-plain']['wall_s']:>7.2f} "
              f"{'':>9} {row['eva-plain']['live_mib']:>9.1f} {row['eva-plain']['live_mib'] / f['live_mib']:>8.2f}x", flush=True)


def dropout_lines(rows: dict[tuple[str, int], dict]) -> list[str]:
    """One line per dropout row: the fused path against the plain path it replaces and exact attention,
    and against the same layer without dropout where that row ran too."""
    out = []
    for (variant, n), row in sorted(rows.items()):
        if variant not in DROPOUT_ROWS:
            continue
        e, plain = row["eva"]["cpu_s"], row["eva-plain"]["cpu_s"]
        line = (f"{variant} {n}: attention dropout 0.1, EVA fused {e:.2f} s vs EVA plain path {plain:.2f} s ({plain / e:.2f}x); "
                f"peak live MiB {row['eva']['live_mib']:.1f} / {row['eva-plain']['live_mib']:.1f}")
        if "full" in row:
            line += f"; exact {row['full']['cpu_s']:.2f} s ({row['full']['cpu_s'] / e:.2f}x), {row['full']['live_mib']:.1f} MiB"
        if ("attn", n) in rows:
            line += f"; the fused path without dropout {rows[('attn', n)]['eva']['cpu_s']:.2f} s"
        out.append(line)
    return out


def verdicts(rows: dict[tuple[str, int], dict]) -> list[str]:
    """One line per target: met, or missed with the measured reason."""
    out = []
    for (variant, n), row in sorted(rows.items()):
        if "full" not in row:  # a dropeva row: no target
            continue
        f, e = row["full"], row["eva"]
        if variant in ("attn", "block") and n in TARGET_SPEEDUP:
            target, speed, limit = TARGET_SPEEDUP[n], f["cpu_s"] / e["cpu_s"], row["flop_limit"]
            if speed >= target:
                why = "met"
            elif limit < target:
                why = f"missed: the target is above the FLOP limit {limit:.2f}x (projections and MLP cost the same in both)"
            else:
                why = f"missed: EVA runs at {speed / limit:.0%} of the FLOP limit {limit:.2f}x"
                if "proj_s" in row:  # the attention's own share: each method's time less the projections'
                    own_full, own_eva = f["cpu_s"] - row["proj_s"], e["cpu_s"] - row["proj_s"]
                    why += (f"; the projections alone take {row['proj_s']:.2f} s of EVA's {e['cpu_s']:.2f} s, and the "
                            f"attention itself runs {own_full / own_eva:.2f}x faster than exact attention's "
                            f"(its own FLOP limit {attention_flop_limit(n):.2f}x)")
            out.append(f"{variant} {n}: speed-up {speed:.2f}x vs target {target}x: {why}")
        if variant in ("attn", "block", "bf16") and n in MEMORY_TARGET_LENGTHS:
            ratio = e["live_mib"] / f["live_mib"]
            why = "met" if ratio <= 1 else f"missed: EVA holds {e['live_mib'] - f['live_mib']:.1f} MiB more at its peak"
            out.append(f"{variant} {n}: EVA peak live memory / exact {ratio:.2f} vs target <= 1: {why}")
    return out


def main(rows: list[str] = ("attn", "block"), lengths: list[int] = (8192, 32768), dropout_lengths: list[int] = (8192,),
         dropout_eva_lengths: list[int] = (), bf16_lengths: list[int] = (8192,), models: list[str] = ("tiny", "350m"),
         model_length: int = 8192, repeats: int = 2) -> None:
    """Layer `rows` (attn, block) at `lengths`; `drop` rows at `dropout_lengths`, `dropeva` at `dropout_eva_lengths`,
    `bf16` rows at `bf16_lengths` (skipped without AVX512-BF16); whole-model rows (`models`: tiny, 350m) at
    `model_length`; `repeats` timed processes per method and row, alternating."""
    print(timing.machine())
    print("CPU seconds per forward+backward at one thread (speed-up full/EVA beside the FLOP limit); wall seconds;")
    print("peak live MiB allocated by the pass (EVA/full)")
    print(f"{'row':>5} {'dtype':>5} {'tokens':>6} {'full s':>8} {'eva s':>8} {'speed-up':>9} {'FLOP lim':>9} {'full wl':>7} "
          f"{'eva wl':>7} {'full MiB':>9} {'eva MiB':>9} {'eva/full':>9}")
    plan = [(row, n) for row in rows for n in lengths]
    plan += [("drop", n) for n in dropout_lengths]
    plan += [("dropeva", n) for n in dropout_eva_lengths]
    plan += [("bf16", n) for n in (bf16_lengths if bf16_supported() else [])]
    plan += [(name, model_length) for name in models]
    found = {}
    for variant, n in plan:
        found[(variant, n)] = compare(variant, n, repeats)
        print_row(variant, n, found[(variant, n)])
    print("\n".join(verdicts(found) + dropout_lines(found)))


if __name__ == "__main__":
    raise SystemExit(timing.cli(main, __doc__, {"measure": measure}))
