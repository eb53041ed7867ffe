"""Progress: one fixed-format line per log step on rank 0, the same record in metrics.jsonl.

The line (nanochat `print0`, torchtitan `MetricsProcessor`):
    step    10/100 | loss 5.4321 | lr 8.00e-05 | gnorm 0.912 | tok/s 12,345 | mfu n/a | mem 1.23GiB | eta 0:01:23
MFU is shown where the accelerator's peak is known (`PEAK_FLOPS`); a CPU has none. The line's MFU
counts attention causally (`flops_per_token`); the record also holds `mfu_torchtitan`, torchtitan's
count, which credits every query with all T keys. TensorBoard is
optional and sits behind the same `log` call as a null logger when off.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from evalm.config_toolkit import MissingExtra
from evalm.config_toolkit.machine import device_name
from evalm.storage.files import appended

# Dense bf16 peak FLOP/s by device-name fragment (vendor data sheets, no sparsity).
PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "A10G": 125e12, "L40S": 362e12,
              "L4": 121e12, "V100": 125e12}


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = device_name(device)
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


def attention_keys(model, seq_len: int) -> float:
    """Keys a query reads on average in a line of seq_len tokens: (T + 1)/2 for exact causal
    attention; for EVA its local block, sink keys and visible chunk summaries (`Tiling.mean_keys`,
    the rule of docs/eva.md); for window-only attention the block alone. A `[model]` that is not an
    EVALM decoder (a converted model's) counts as exact attention."""
    kind = getattr(model, "attention", "full")
    if kind == "full":
        return (seq_len + 1) / 2
    from evalm.tiling import Ablation, Tiling  # torch: only where a decoder's rule is counted

    return Tiling.of(model, model.head_dim, Ablation.NO_REMOTE if kind == "window" else Ablation.NONE).mean_keys(seq_len)


def flops_per_token(n_params: int, model, seq_len: int) -> dict[str, float]:
    """Training FLOPs per token (forward + backward, PaLM appendix B): 6N for the parameters' matrix
    products (N: `n_params`, `matmul_params` of the model) plus attention's own, 12·L·E·K for the
    QKᵀ and PV products over the K keys a query reads on average (`attention_keys`); activation
    checkpointing's recomputed forward is not counted (MFU, not HFU). Returns the parts and "total"
    (this causal-aware count), and "torchtitan": the same 6N with every query counted against all T
    keys of its line, 6N + 12·L·H·Q·T (torchtitan's `get_num_flop_per_token`, the scale llm-foundry's
    and torchtitan's MFU figures are on). That count does not look at the attention kind: for EVA and
    window-only attention it is the work of exact attention at the same shape, so tokens/s of EVA and
    its twin convert to MFU by one factor."""
    keys = attention_keys(model, seq_len)
    parts = {"params": 6.0 * n_params, "attention": 12.0 * model.n_layer * model.d_model * keys, "keys_per_query": keys}
    dense = 12.0 * model.n_layer * model.d_model * seq_len  # H·Q = E
    return {**parts, "total": parts["params"] + parts["attention"], "torchtitan": parts["params"] + dense}


def matmul_params(model: torch.nn.Module) -> int:
    """Parameters used in matrix products per token: the weights of every `nn.Linear`, each once (a
    tied output matrix is the LM head's; lookup tables, norms and biases do no products)."""
    weights = {id(m.weight): m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}
    return sum(w.numel() for w in weights.values())


def format_line(r: dict[str, Any]) -> str:
    width = len(str(r["total_steps"]))
    mfu = "n/a" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
    eta = time.strftime("%H:%M:%S", time.gmtime(r["eta_s"])) if r["eta_s"] < 86400 else f"{r['eta_s'] / 3600:.0f}h"
    return (f"step {r['step']:>{width}}/{r['total_steps']} | loss {r['loss']:.4f} | lr {r['lr']:.2e} | "
            f"gnorm {r['grad_norm']:.3f} | tok/s {r['tokens_per_s']:,.0f} | mfu {mfu} | "
            f"mem {r['peak_mem_gib']:.2f}GiB | eta {eta}")


class MetricsLogger:
    """Writes on rank 0 only; other ranks get a logger that does nothing."""

    def __init__(self, out: str | Path, *, enabled: bool, tensorboard: bool):
        self.enabled = enabled
        self.path = Path(out) / "metrics.jsonl"
        self._tb = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:
                raise MissingExtra("train.tensorboard = true needs: pip install 'evalm[tensorboard]'") from err
            self._tb = SummaryWriter(str(Path(out) / "tensorboard"))

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        print(format_line(record), flush=True)
        with appended(self.path) as f:  # never through a link
            f.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "step":
                    self._tb.add_scalar(key, value, record["step"])

    def info(self, text: str) -> None:
        if self.enabled:
            print(text, file=sys.stdout, flush=True)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
