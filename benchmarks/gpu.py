"""EVA where pretraining runs: its GPU route checked and measured on one GPU, in one command.

    python benchmarks/gpu.py --out OUT [--budget 450] [--sections attention train cache]

Writes OUT/gpu.json (every figure; rewritten after each row) and OUT/gpu.md (the tables of docs/results.md,
launcher/gpu_tables.py's), printing the tables last. A section or row that would start past the budget is
skipped and says so. Every ratio is against a baseline measured in the same process on the same GPU. On the
device it runs under scripts/device_run.sh (launcher/device_run.py), a section a process, after the CUDA tests.

  attention  one EVA layer's attention (summaries, slots, one flex_attention call) forward + backward
             against PyTorch's Flash-2 SDPA (causal) and, where it takes the call, cuDNN's (`speedup_fastest`:
             against the faster of the two), 16 heads of 64, bf16, w 128, c 8, at 8k / 32k / 128k
             tokens (32,768 tokens a batch below 32k), without and with attention dropout 0.1
  train      configs/evalm-350m.toml on one GPU (FSDP2 world of one, bf16, activation checkpointing, dropout
             and attention dropout 0.1 as Table 6) on random tokens at 8,192 and 32,768 tokens a line, 32,768
             a micro-batch, EVA and its full-attention twin (SDPA, its backend PyTorch's pick); with --compile
             also at 8k compiled, each row with dynamo's graphs and every graph break's reason
  cache      the 350M shape's cache (bf16, random weights): 16 / 256 / 2,000 demonstrations encoded
             once, then per test item a fork, its 10-token shared test prefix, two 2-token candidates;
             the full-attention twin's K/V cache over the same context beside it

FLOPs per token of training (train/metrics.py): 6N for the Linear weights plus attention's own, 12·L·E·K
for K keys a query reads on average (exact: (T + 1)/2; EVA: its block, its visible summaries). Attention
FLOPs of one call: 4·B·H·D·Σ_i K(i) forward, 3.5× that forward + backward (FlashAttention's count: the
backward's five products, one recomputing the scores). MFU uses the vendor's dense bf16 peak
(train/metrics.py) and, beside it, the matrix-product rate measured here (8192³ bf16, `matmul_tflops`);
`mfu_torchtitan` counts every query against all T keys (torchtitan's 6N + 12·L·H·Q·T), at the datasheet peak.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

import timing
from evalm.config_toolkit.machine import device_name, peak_gpu_gib
from evalm.storage import write_atomic

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "evalm-350m.toml"
TOKENS_PER_BATCH = 32768


def sync_time(fn, repeats: int, warmup: int = 2) -> float:
    """Median seconds of fn() over `repeats` runs after `warmup`, with the GPU synchronised around each."""
    return timing.best_of(fn, repeats, warmup, pick=statistics.median, sync=torch.cuda.synchronize)


def matmul_tflops() -> float:
    """The bf16 matrix-product rate of this GPU: an 8192³ product on random data."""
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return 2 * 8192**3 / sync_time(lambda: a @ b, 10, 3) / 1e12


def model_config(**changes):
    from evalm import ModelConfig
    from evalm.config_toolkit import build, read_toml

    return build(ModelConfig, {**read_toml(CONFIG)["model"], **changes}, where=f"{CONFIG} [model]")


def _attention_pair(n: int, dropout: float):
    """(EVA fwd+bwd, SDPA fwd+bwd) closures over fresh bf16 q, k, v of 16 heads of 64, and the layer's Tiling."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from evalm.eva import EvaAttention

    B = max(1, TOKENS_PER_BATCH // n)
    layer = EvaAttention(model_config(attn_dropout=dropout)).cuda().train()
    q, k, v = (torch.randn(B, n, 16, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    d_out = torch.randn(B, n, 16, 64, device="cuda", dtype=torch.bfloat16)

    def eva():
        layer.attend(q, k, v).backward(d_out)

    def sdpa(backend=SDPBackend.FLASH_ATTENTION):
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, dropout_p=dropout)
        out.transpose(1, 2).backward(d_out)

    return eva, sdpa, layer.layout, B


def _cudnn_ms(sdpa, repeats: int) -> float | None:
    """cuDNN's SDPA (the fastest backend on Hopper; the twin trains on it) in ms, or None where it
    does not take the call (no cuDNN attention in this build, or dropout it does not support)."""
    from torch.nn.attention import SDPBackend

    try:
        return sync_time(lambda: sdpa(SDPBackend.CUDNN_ATTENTION), repeats) * 1e3
    except RuntimeError:
        return None


def top_kernels(fn, k: int = 12) -> list[dict]:
    """The k GPU kernels fn() spends most time in (the profile behind a gap), ms per call of fn."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
    except Exception as err:  # noqa: BLE001 (a profile is an aid; its absence is recorded, the figures stand)
        return [{"kernel": f"profiler failed: {type(err).__name__}: {err}"[:200], "ms": 0.0, "share": 0.0}]
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]  # kernels (host ops have none of their own)
    events.sort(key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in events) or 1
    return [{"kernel": e.key[:90], "ms": e.self_device_time_total / 1e3, "share": e.self_device_time_total / total}
            for e in events[:k]]


def _peak_gib(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


def each_row(ctx: dict, section: str, plan: list[dict], margin_s: float, measure, rows: list[dict]) -> list[dict]:
    """measure(**key) for each key of `plan` into `rows`, each saved as it ends: a row that would start within
    `margin_s` of the deadline is skipped, a failed one recorded (one failed row is a finding; the others run)."""
    for key in plan:
        if time.perf_counter() > ctx["deadline"] - margin_s:
            rows.append({**key, "skipped": "budget"})
            continue
        try:
            rows.append(measure(**key))
        except Exception as err:  # noqa: BLE001 (the finding is the error; the section goes on)
            rows.append({**key, "skipped": f"{type(err).__name__}: {err}"[:500]})
            print(f"{section} {key}: {rows[-1]['skipped']}", flush=True)
        torch.cuda.empty_cache()
        ctx["save"](section, rows)
    return rows


def attention(ctx: dict) -> dict:
    plan = [{"n": n, "dropout": d} for n, d in ((8192, 0.0), (32768, 0.0), (8192, 0.1), (32768, 0.1), (131072, 0.0))]
    return {"rows": each_row(ctx, "attention", plan, 30, _attention_row, [])}  # the goals' rows first


def _attention_row(n: int, dropout: float) -> dict:
    eva, sdpa, t, B = _attention_pair(n, dropout)
    t0 = time.perf_counter()
    eva()  # compiles
    compile_s = time.perf_counter() - t0
    repeats = 10 if n <= 32768 else 4
    eva_s, sdpa_s, cudnn_ms = sync_time(eva, repeats), sync_time(sdpa, repeats), _cudnn_ms(sdpa, repeats)
    fastest_s = min(sdpa_s, cudnn_ms / 1e3) if cudnn_ms else sdpa_s
    fwd_eva = 4 * B * 16 * 64 * n * t.mean_keys(n)
    fwd_full = 4 * B * 16 * 64 * n * (n + 1) / 2
    row = {"n": n, "batch": B, "dropout": dropout, "eva_ms": eva_s * 1e3, "sdpa_ms": sdpa_s * 1e3,
           "speedup": sdpa_s / eva_s, "cudnn_ms": cudnn_ms, "speedup_fastest": fastest_s / eva_s,
           "flop_limit": fwd_full / fwd_eva, "eva_keys_per_query": t.mean_keys(n),
           "eva_tflops": 3.5 * fwd_eva / eva_s / 1e12, "sdpa_tflops": 3.5 * fwd_full / sdpa_s / 1e12,
           "eva_peak_gib": _peak_gib(eva), "sdpa_peak_gib": _peak_gib(sdpa), "eva_compile_s": compile_s}
    if n == 8192 and dropout == 0:
        row["eva_profile"] = top_kernels(eva)
    print(f"attention n={n} dropout={dropout}: EVA {row['eva_ms']:.2f} ms, SDPA {row['sdpa_ms']:.2f} ms, "
          f"{row['speedup']:.2f}x (FLOP limit {row['flop_limit']:.1f}x), compile {compile_s:.0f} s", flush=True)
    return row


class RandomLines:
    """A line source of random tokens (train/data.py `LineSource`): line i drawn from seed i."""

    def __init__(self, seq_len: int, vocab: int, n: int = 4096):
        self.seq_len, self.vocab, self.n = seq_len, vocab, n

    def __len__(self) -> int:
        return self.n

    def line(self, i: int):
        return np.random.default_rng(i).integers(0, self.vocab, self.seq_len + 1, dtype=np.int64), None


def _train_row(attention: str, n: int, compiled: bool, runtime, steps: int, peaks: dict) -> dict:
    from evalm.config_toolkit import build, read_toml
    from evalm.train.config import OptimConfig
    from evalm.train.data import LineLoader
    from evalm.train.metrics import flops_per_token, matmul_params
    from evalm.train.parallelize import BuildPlan, build_model
    from evalm.train.loop import Loop, make_optimizer, run_steps, train_step

    config = model_config(attention=attention)
    model = build_model(config, runtime, BuildPlan(bf16=True, activation_checkpointing=True, compile_blocks=compiled))
    optimizer = make_optimizer(model, build(OptimConfig, read_toml(CONFIG)["optim"], where=str(CONFIG)))
    loader = LineLoader(RandomLines(n, config.vocab_size), rank=0, world_size=1, batch_size=TOKENS_PER_BATCH // n,
                        shuffle=False, seed=0)
    model.train()
    (counters := torch._dynamo.utils.counters).clear()  # what this row compiles: graphs, each break's reason
    t0 = time.perf_counter()
    losses = run_steps(model, optimizer, loader, runtime, Loop(0, 2, train_step))  # compiles, warms up
    warm_s, graphs = time.perf_counter() - t0, {"graphs": counters["stats"]["unique_graphs"], "breaks": dict(counters["graph_break"])}
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    losses += run_steps(model, optimizer, loader, runtime, Loop(0, steps, train_step))
    torch.cuda.synchronize()
    step_s = (time.perf_counter() - t0) / steps
    step = lambda m=model, o=optimizer: train_step(m, o, loader, runtime)  # noqa: E731
    profile = top_kernels(step) if n == 8192 else None
    flops = flops_per_token(matmul_params(model), config, n)
    tok_s = TOKENS_PER_BATCH / step_s
    row = {"attention": attention, "n": n, "compiled": compiled, "steps": steps, "step_s": step_s, "tokens_per_s": tok_s,
           "flops_per_token": flops, "mfu_datasheet": tok_s * flops["total"] / peaks["datasheet"],
           "mfu_torchtitan": tok_s * flops["torchtitan"] / peaks["datasheet"],
           "mfu_measured_peak": tok_s * flops["total"] / peaks["measured"], "peak_gib": peak_gpu_gib("cuda"),
           "warmup_s": warm_s, "loss_first": losses[0], "loss_last": losses[-1], "profile": profile, **graphs}
    del model, optimizer
    torch.cuda.empty_cache()
    print(f"train {attention} n={n}{' compiled' if compiled else ''}: {tok_s:,.0f} tok/s, MFU {100 * row['mfu_datasheet']:.1f}% "
          f"(measured peak: {100 * row['mfu_measured_peak']:.1f}%), {row['peak_gib']:.1f} GiB", flush=True)
    return row


def train(ctx: dict) -> dict:
    from evalm.train.parallelize import init_distributed

    runtime = init_distributed("cuda")
    plan = [(8192, kind, False) for kind in ("eva", "full")]
    plan += [(8192, kind, True) for kind in ("eva", "full")] if ctx["compile"] else []  # train.compile, same run
    plan += [(32768, kind, False) for kind in ("eva", "full")]
    row = functools.partial(_train_row, runtime=runtime, steps=ctx["train_steps"], peaks=ctx["peaks"])
    rows = each_row(ctx, "train", [{"attention": k, "n": n, "compiled": c} for n, k, c in plan], 40, row, [])
    torch.distributed.destroy_process_group()
    return {"rows": rows, "batch_tokens": TOKENS_PER_BATCH}


@torch.no_grad()
def _item_seconds(model, context: torch.Tensor, items: int) -> tuple[float, float, int]:
    """(encode seconds of the context, median seconds per test item, cache bytes)."""
    cache = model.new_cache()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for lo in range(0, context.shape[1], 4096):  # segments: the full twin's logits stay (4,096 × n)
        model(context[:, lo : lo + 4096], cache=cache)
    torch.cuda.synchronize()
    encode_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(1)
    V = model.config.vocab_size

    def item():
        node = cache.fork()
        model(torch.randint(0, V, (1, 10), generator=gen).cuda(), cache=node)  # the shared test prefix
        model(torch.randint(0, V, (2, 2), generator=gen).cuda(), cache=node.fork(batch_size=2))  # two candidates

    return encode_s, sync_time(item, items, 3), cache.nbytes()


def _cache_row(model, rng: np.random.Generator, attention: str, shots: int) -> dict:
    tokens = sum(int(rng.integers(8, 15)) for _ in range(shots))
    context = torch.from_numpy(rng.integers(0, model.config.vocab_size, (1, tokens))).cuda()
    encode_s, item_s, nbytes = _item_seconds(model, context, 20)
    kv = 2 * model.config.n_layer * tokens * model.config.d_model * 2  # bf16 K and V of every token
    print(f"cache {attention} {shots} shots ({tokens} tokens): {item_s * 1e3:.2f} ms/item, "
          f"{nbytes / 2**20:.1f} MiB (K/V {kv / 2**20:.1f} MiB)", flush=True)
    return {"attention": attention, "shots": shots, "tokens": tokens, "encode_s": encode_s,
            "item_ms": item_s * 1e3, "cache_mib": nbytes / 2**20, "kv_cache_mib": kv / 2**20}


def cache(ctx: dict) -> dict:
    rng, rows = np.random.default_rng(0), []
    for kind in ("eva", "full"):
        plan = [{"attention": kind, "shots": s} for s in (16, 256, 2000)]
        each_row(ctx, "cache", plan, 15, functools.partial(_cache_row, timing.random_model(str(CONFIG), attention=kind).to("cuda", torch.bfloat16), rng), rows)
        torch.cuda.empty_cache()  # the model went with the partial
    return {"rows": rows}


SECTIONS = {"attention": attention, "train": train, "cache": cache}  # the CUDA tests: launcher/device_run.py


def table(report: dict) -> str:
    """The markdown tables of a report, written by launcher/gpu_tables.py as in docs/results.md."""
    from evalm.launcher.gpu_tables import attention_lines, cache_lines, train_lines

    peaks = report["peaks_tflops"]
    out = [f"{report['device']}, torch {report['torch']} (CUDA {report['cuda']}), commit {report['commit'] or 'n/a'}; bf16 "
           f"matrix products {peaks['measured']:.0f} TFLOP/s measured here, {peaks['datasheet']:.0f} datasheet"]
    for name, lines in (("attention", attention_lines), ("train", train_lines), ("cache", cache_lines)):
        section = report.get(name)
        notes = [f"{name}: {k}: {section[k]}" for k in ("error", "skipped") if section and k in section]
        out += ["", *(notes or lines(section and {"status": "ok", "result": section}))]
    return "\n".join(out) + f"\n\ntotal {report.get('total_s', 0):.0f} s\n"


def _saver(path: Path, report: dict):
    """save(): gpu.json, whole or not at all; save(section, rows) first records the rows so far (the device
    run kills a section at its timeout: it keeps every row finished)."""

    def save(name: str | None = None, rows: list[dict] | None = None) -> None:
        if name is not None:
            report[name] = {"rows": rows, "partial": True}
        write_atomic(path, json.dumps(report, indent=2, default=str))
    return save


def main(out: Path, budget: float = 450.0, sections: list[str] = tuple(SECTIONS), train_steps: int = 30,
         compile: bool = False, commit: str = "") -> int:
    """`budget` seconds for all sections (a section or row that would start too late is skipped);
    `train_steps` timed optimizer steps per training row after 2 warm-up steps; `compile` also trains at 8k
    with each block compiled; `commit` the commit the run was made at (recorded)."""
    if set(sections) - set(SECTIONS):
        print(f"benchmarks/gpu.py: --sections takes {', '.join(SECTIONS)}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("benchmarks/gpu.py: no CUDA GPU here; run it on a GPU machine", file=sys.stderr)
        return 2
    from evalm.train.metrics import peak_flops

    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    ctx = {"deadline": start + budget, "train_steps": train_steps, "out": out, "compile": compile,
           "peaks": {"datasheet": peak_flops(device) or float("nan"), "measured": matmul_tflops() * 1e12}}
    report = {"device": device_name("cuda"), "torch": torch.__version__, "cuda": torch.version.cuda,
              "commit": commit, "peaks_tflops": {k: v / 1e12 for k, v in ctx["peaks"].items()}}
    ctx["save"] = _saver(out / "gpu.json", report)
    for name in sections:
        t0 = time.perf_counter()
        if t0 > ctx["deadline"]:
            report[name] = {"skipped": "budget"}
            continue
        try:
            report[name] = SECTIONS[name](ctx)
        except Exception as err:  # noqa: BLE001 (a broken section is a finding; the others still run)
            report[name] = {"error": f"{type(err).__name__}: {err}"[:2000]}
            print(f"section {name}: {type(err).__name__}: {err}", flush=True)
        report[name]["section_s"] = time.perf_counter() - t0
        ctx["save"]()
    report["total_s"] = time.perf_counter() - start
    ctx["save"]()
    text = table(report)
    (out / "gpu.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(timing.cli(main, __doc__))
