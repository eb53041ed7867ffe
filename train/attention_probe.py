"""`evalm train probe`: what EVA's summaries carry in each layer of a converted model, on token lines.

    evalm train probe --hf-model runs/smollm2-eva --shards runs/smollm2-tokens --seq-len 8192 --lines 4 --out runs/probe-0
    evalm train probe --hf-model runs/transfer/hf --shards runs/smollm2-tokens --seq-len 8192 --lines 4 --out runs/probe-transfer

Per layer, on the model's own rotated heads with teacher forcing (every layer sees the hidden states of
exact softmax attention, as attention transfer trains, train/attention_transfer.py):
- `outside`: the share of the exact softmax attention's mass on keys before the query's EVA window and
  after the sink (keys only the chunk summaries stand for); `sink`: its mass on the sink tokens outside
  the window (exact keys in EVA);
- `error`: EVA's output against the exact one, mean squared error per head before `o_proj` (the transfer
  loss); `error_no_remote`: the same with the summaries off (`no-remote`, the window and sink alone).
Each by query position, in buckets [w, 2w), [2w, 4w), … (a query in the first block reads no key outside
its window, and EVA is exact there). In a layer whose `outside` mass is large, the summaries carry it
where `error` is below `error_no_remote`; where it is above, they add error instead (LoLCATs' question of a
linear attention, Zhang et al. 2025 §3.1, asked of EVA's summaries). Run it on a converted folder before
and after transfer or LoRA: the weights of q and k change with LoRA, and with them `outside`.

The lines are the first `--lines` lines of the shards in the order the trainer reads them (`--seed`,
shuffled as `[data] shuffle` is by default), written with the model's tokenizer (else one line).
OUT/probe.json holds every figure; the table is printed.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from evalm.config_toolkit import ConfigError, Parser, report
from evalm.config_toolkit.device import device_flag
from evalm.config_toolkit.markdown import markdown
from evalm.storage import RunFolder

NAME = "eva_probe"
"""The attention implementation a probe runs the model with."""
PROBE = "eva_probe_stats"
"""The attribute of an attention module that holds its layer's figures of the last forward."""
QUERY_BLOCK = 256
"""Queries whose exact softmax rows are held at once: (B, H, 256, T) float32, 75 MB at T = 8,192, H = 9."""
FIGURES = ("outside", "sink", "error", "error_no_remote")


def buckets(n: int, window: int) -> list[tuple[int, int]]:
    """Query positions [w, 2w), [2w, 4w), … up to n (the last bucket cut at n)."""
    edges, start = [], window
    while start < n:
        edges.append((start, min(2 * start, n)))
        start *= 2
    return edges


def outside_mass(q: Tensor, k: Tensor, window_start: Tensor, sink: int, scale: float) -> tuple[Tensor, Tensor]:
    """Exact causal softmax attention of q (B, H, T, D) over k (B, H, T, D): per query (B, H, T), the mass on
    keys sink ≤ j < window_start(i) and on keys j < min(sink, window_start(i)). Blocks of queries, float32."""
    B, H, T, _ = q.shape
    outside, on_sink = q.new_zeros(B, H, T, dtype=torch.float32), q.new_zeros(B, H, T, dtype=torch.float32)
    for a in range(0, T, QUERY_BLOCK):
        b = min(T, a + QUERY_BLOCK)
        logits = scale * torch.einsum("bhid,bhjd->bhij", q[:, :, a:b].float(), k[:, :, :b].float())
        rows = torch.arange(a, b, device=q.device)[:, None]
        logits = logits.masked_fill(torch.arange(b, device=q.device) > rows, -math.inf)
        before = F.pad(logits.softmax(-1).cumsum(-1), (1, 0))  # before[..., x]: mass on keys j < x
        start = window_start[a:b].expand(B, H, -1)[..., None]
        head = before.gather(-1, start.clamp(max=sink))  # keys j < min(S, ws)
        outside[:, :, a:b] = (before.gather(-1, start) - head).squeeze(-1)
        on_sink[:, :, a:b] = head.squeeze(-1)
    return outside, on_sink


def probe_attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                    scaling: float | None = None, dropout: float = 0.0, **kwargs) -> tuple[Tensor, None]:
    """The exact attention's output (B, T, H, D) (teacher forcing); the layer's figures per query position
    (B, T) are left on the module (`PROBE`) for `take_stats`."""
    from evalm.hf_attention import eva_attention, eva_of
    from evalm.tiling import Ablation

    groups = query.shape[1] // key.shape[1]
    keys, values = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    teacher = F.scaled_dot_product_attention(query, keys, values, is_causal=True, scale=scaling).transpose(1, 2)
    eva = eva_of(module)
    student, _ = eva_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    kept = eva.layout.ablation
    eva.ablate(Ablation.NO_REMOTE)
    try:
        window_only, _ = eva_attention(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    finally:
        eva.ablate(kept)
    rule = eva.layout
    starts = rule.window_start(torch.arange(query.shape[2], device=query.device))
    outside, sink = outside_mass(query, keys, starts, rule.sink, rule.scale)
    error = ((student.float() - teacher.float()) ** 2).mean((-2, -1))
    error_no_remote = ((window_only.float() - teacher.float()) ** 2).mean((-2, -1))
    setattr(module, PROBE, {"outside": outside.mean(1), "sink": sink.mean(1), "error": error,
                            "error_no_remote": error_no_remote})
    return teacher.contiguous(), None


def take_stats(model: torch.nn.Module) -> list[dict[str, Tensor]]:
    """Each layer's figures of the forward just run, in layer order, cleared from their modules."""
    holders = [m for m in model.modules() if getattr(m, PROBE, None) is not None]
    if not holders:
        raise RuntimeError("probe: no layer's attention ran as probe_attention")
    stats = [getattr(m, PROBE) for m in holders]
    for m in holders:
        setattr(m, PROBE, None)
    return stats


def use_probe(model) -> None:
    """Make a loaded EVA model run its layers as `probe_attention` (registered under NAME)."""
    from evalm.hf_attention import register_attention
    from evalm.hf_private import set_attention

    register_attention(NAME, probe_attention)
    set_attention(model.config, NAME)


@torch.no_grad()
def probe(model, lines: Sequence[Tensor], window: int) -> list[dict[str, list[float]]]:
    """Per layer, each figure's mean over the lines' queries in each bucket of `buckets(T, window)`."""
    use_probe(model)
    model.eval()
    per_line = []  # per line: per layer, per figure, the bucket means
    for line in lines:
        model(line[None].to(next(model.parameters()).device), use_cache=False, logits_to_keep=1)
        edges = buckets(line.shape[0], window)
        per_line.append([{name: [float(stats[name][0, a:b].double().mean()) for a, b in edges] for name in FIGURES}
                         for stats in take_stats(model)])
    return [{name: [sum(line[layer][name][i] for line in per_line) / len(per_line)
                    for i in range(len(per_line[0][layer][name]))] for name in FIGURES}
            for layer in range(len(per_line[0]))]


def table(layers: list[dict[str, list[float]]], edges: list[tuple[int, int]]) -> str:
    """One row per layer and figure, one column per bucket of query positions."""
    rows = [[str(i), name, *(f"{v:.4g}" for v in layer[name])] for i, layer in enumerate(layers) for name in FIGURES]
    return markdown(["layer", "figure", *(f"[{a:,}, {b:,})" for a, b in edges)], rows)


def read_lines(shards: str | Path, seq_len: int, n: int, seed: int) -> list[Tensor]:
    """The first `n` lines of `seq_len` tokens in the order the trainer reads the shards (shuffled by `seed`)."""
    from evalm.train.data import LineLoader
    from evalm.train.shards import PretrainLines, TokenShards

    source = PretrainLines(TokenShards(shards), seq_len)
    if len(source) < n:
        raise ConfigError(f"--shards {shards}: {len(source)} lines of {seq_len} tokens, fewer than --lines {n}")
    loader = LineLoader(source, rank=0, world_size=1, batch_size=1, shuffle=True, seed=seed)
    return [loader.next_batch()[0][0] for _ in range(n)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="evalm train probe", description=__doc__.split("\n")[0])
    parser.add_argument("--hf-model", required=True, metavar="DIR", help="a converted folder (evalm convert, or an "
                        "uptrain run's OUT/hf) (required)")
    parser.add_argument("--shards", required=True, metavar="DIR", help="token shards written with the model's "
                        "tokenizer (evalm train tokenizer --tokenizer DIR/tokenizer.json) (required)")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for probe.json (required)")
    parser.add_argument("--seq-len", type=int, default=8192, metavar="N", help="tokens per line (default: 8192, "
                        "SmolLM2's trained length)")
    parser.add_argument("--lines", type=int, default=4, metavar="N", help="lines probed (default: 4)")
    parser.add_argument("--seed", type=int, default=1234, help="the order the lines are drawn in, as [data] seed "
                        "(default: 1234, the trainer's: the lines a run starts with)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", type=device_flag,
                        help="torch device (default: cuda when there is one, else cpu)")
    try:
        args = parser.parse_args(list(argv if argv is not None else sys.argv[1:]))
        if args.seq_len < 1 or args.lines < 1:
            raise ConfigError("--seq-len and --lines must be >= 1")
        result = run(ProbeRun(args.hf_model, args.shards, args.out, args.seq_len, args.lines, args.seed, args.device))
    except Exception as err:  # noqa: BLE001 - the one rule: a user error in one line, else a bug with its log
        return report("evalm train probe", err)
    print(result)
    return 0


@dataclass(frozen=True)
class ProbeRun:
    """What `evalm train probe` reads and where it writes: the converted folder, the token shards and the
    lines drawn from them (their length, count and the order's seed), the output folder, the device."""

    hf_model: str
    shards: str
    out: str
    seq_len: int
    n_lines: int
    seed: int
    device: str


def run(probe_run: ProbeRun) -> str:
    """Probe the model on the lines, write OUT/probe.json; returns the table."""
    from evalm.train.uptrain import check_shards
    from evalm.train.uptrain_model import load_converted

    hf_model, shards, out, seq_len = probe_run.hf_model, probe_run.shards, probe_run.out, probe_run.seq_len
    n_lines, seed, device = probe_run.n_lines, probe_run.seed, probe_run.device

    check_shards(shards, hf_model)
    with RunFolder(out, "evalm train probe", inputs=[hf_model, shards]).held() as folder:
        model = load_converted(hf_model).to(device)
        window = model.config.eva_settings().window_size
        layers = probe(model, read_lines(shards, seq_len, n_lines, seed), window)
        edges = buckets(seq_len, window)
        folder.write_json("probe.json", {"hf_model": str(hf_model), "shards": str(shards), "seq_len": seq_len,
                                         "lines": n_lines, "seed": seed, "window": window, "buckets": edges,
                                         "layers": layers})
    return table(layers, edges)


if __name__ == "__main__":
    sys.exit(main())
