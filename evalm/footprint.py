"""What a model and a batch will take in memory, estimated before anything is allocated.

`--set model.n_layer=1e9` or `--set train.batch_size=1e9` grew a process for minutes without a line
of output until the kernel killed it; `d_model=1e9` or `vocab_size=1e12` ended in an allocator's
error reported as a bug. A config is data, and its sizes are checked like any other input: the
bytes a run must hold are estimated from the shape alone, and a run that cannot fit is refused in
one line that gives the estimate and what the machine has (`check_fits`).

The estimates are lower bounds (the run needs at least this), so a refusal is never wrong, and
whatever passes is left to run: parameters count the embedding and each block's attention and MLP
matrices (4 d² + 2 d d_ff; norms, biases and EVA's maps come on top); training holds each parameter
4 times (weights, gradients, AdamW's two moments) in float32, divided over the ranks FSDP shards it
across, and a micro-batch's logits and their gradient (B x T x V floats, twice). What is available:
on a GPU the free device memory; on the CPU the kernel's MemAvailable, or less under an address-space
limit (`ulimit -v`) after what the process has mapped already.

The plan (`plan`, `evalm train memory CONFIG... --gpus N`) is the other direction: an estimate, not a
bound, of what each GPU holds when a pretraining config runs under FSDP2 with activation
checkpointing, so that a user can size a cluster before renting it. Its terms follow what
train/parallelize.py builds: every Block and then the root are `fully_shard`ed (ZeRO-3), blocks
reshard after forward, the root (embeddings, final norm, tied LM head) stays gathered; bf16 compute
with fp32 master parameters, fp32 gradient reduction and AdamW's two fp32 moments; each Block is
checkpointed, so the backward keeps every block's input and recomputes one block at a time. EVA's
attention keeps O(n·D) per layer (evalm/recompute.py), never the O(n·(w + n/c)) logits. Add the CUDA
context and allocator fragmentation (the last term's allowance) before comparing with a card.
"""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from evalm.config_toolkit import UserError

FLOAT32 = 4
TRAINING_COPIES = 4
"""Weights, gradients and AdamW's two moments, per parameter."""
GiB = 1 << 30


class TooLarge(UserError, MemoryError):
    """A model or batch whose estimated memory exceeds what the machine has; the message gives both."""


def parameters(vocab_size: int, d_model: int, n_layer: int, d_ff: int) -> int:
    """A lower bound on a decoder's parameters: the embedding and each block's four attention and two MLP matrices."""
    return vocab_size * d_model + n_layer * (4 * d_model * d_model + 2 * d_model * d_ff)


def training_bytes(n_params: int, vocab_size: int, tokens_per_micro_batch: int, world_size: int = 1) -> int:
    """At least what one rank holds to train: its share of the parameters (four float32 copies) and one
    micro-batch's logits with their gradient."""
    return TRAINING_COPIES * FLOAT32 * n_params // max(world_size, 1) + 2 * FLOAT32 * tokens_per_micro_batch * vocab_size


def available_bytes(device: str = "cpu") -> int:
    """Memory this process can still take on `device` (module docstring)."""
    if str(device).startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            free, _ = torch.cuda.mem_get_info(torch.device(device))
            return int(free)
    room = _meminfo("MemAvailable")
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        room = min(room, max(soft - _mapped(), 0))
    return room


def _meminfo(key: str) -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _mapped() -> int:
    """Bytes of address space this process has mapped (VmSize), what `ulimit -v` counts."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def shown(n: int) -> str:
    """Bytes in words: `3.2 GiB`, `2.1e+04 GiB`."""
    value = n / GiB
    return f"{value:.1f} GiB" if value < 1e4 else f"{value:.1e} GiB"


def check_fits(need: int, what: str, device: str = "cpu") -> None:
    """Refuse `what` when it needs more than `device` has (`need`: a lower bound, in bytes)."""
    room = available_bytes(device)
    if need > room:
        raise TooLarge(f"{what} needs at least {shown(need)} of memory, and {device} has {shown(room)} available; "
                       "choose a smaller shape or batch (or a machine with more memory)")


RUNTIME_ALLOWANCE = 2 * GiB
"""CUDA context, NCCL buffers, allocator fragmentation: an allowance, not a measurement."""


@dataclass(frozen=True)
class Shape:
    """What the plan reads from a pretraining config: its `[model]`, lines per GPU per forward ([train]
    batch_size), tokens per line ([data] seq_len) and whether compute is bf16."""

    model: object  # evalm.config.ModelConfig
    micro_batch: int
    seq_len: int
    bf16: bool

    @classmethod
    def read(cls, path: str) -> Shape:
        from evalm.config import ModelConfig
        from evalm.config_toolkit import build, read_toml

        raw = read_toml(path)
        model = build(ModelConfig, raw.get("model", {}), where=f"{path} [model]")
        train = raw.get("train", {})
        return cls(model, int(train.get("batch_size", 1)), int(raw.get("data", {}).get("seq_len", 8192)),
                   train.get("mixed_precision", "fp32") == "bf16")


def parameter_counts(config) -> tuple[int, int]:
    """(parameters of one Block, parameters of the root: embeddings, positions, final norm), counted on a
    meta-device model so the count is the code's, not a formula's."""
    import torch

    from evalm.model import EvalmModel

    with torch.device("meta"):
        model = EvalmModel(config)
    block = sum(p.numel() for p in model.blocks[0].parameters())
    return block, model.num_params() - config.n_layer * block


def block_bytes_per_token(config, act: int) -> int:
    """Activations one Block holds per token while it is recomputed in backward (`act` bytes each).

    attn_norm out, q, k, v, attention out, out_proj out, residual, mlp_norm out (8E); fc1 out and the
    ReLU out fc2 reads (2F); two dropout masks (1 byte each, E); the per-row log-sum-exp (fp32, H); EVA's
    chunk state, recomputed in backward rather than kept (k̃, ω, β and the gradients of k̃, β, ω: 6E/c
    while the attention's backward runs). Gradients of the same tensors are in flight at once, so the
    plan counts the block twice."""
    E, F, H, c = config.d_model, config.d_ff, config.n_head, config.chunk_size
    return act * (8 * E + 2 * F + 6 * E // c) + 2 * E + 4 * H


def eva_working_set(shape: Shape) -> int:
    """Bytes of one tile group's fp32 temporaries (logits, probabilities, their gradient, the dropout
    mask): a group is at most GROUP_LOGITS logits, since a block over more is cut into pieces of rows
    (evalm/recompute.py), never thinner than MIN_PIECE rows."""
    from evalm.recompute import MIN_PIECE
    from evalm.tiling import GROUP_LOGITS

    cfg = shape.model
    ext = cfg.window_size if cfg.overlap_window else 0
    thinnest = shape.micro_batch * cfg.n_head * MIN_PIECE * (ext + cfg.window_size + shape.seq_len // cfg.chunk_size)
    return FLOAT32 * 4 * max(GROUP_LOGITS, thinnest)


def plan(shape: Shape, gpus: int) -> list[tuple[str, float]]:
    """(term, bytes) per GPU of `shape` trained under FSDP2 over `gpus` GPUs (module docstring)."""
    cfg = shape.model
    block, root = parameter_counts(cfg)
    total = cfg.n_layer * block + root
    act = 2 if shape.bf16 else FLOAT32
    tokens = shape.micro_batch * shape.seq_len
    return [
        ("fp32 parameters, sharded", FLOAT32 * total / gpus),
        ("fp32 gradients, sharded", FLOAT32 * total / gpus),
        ("AdamW moments (2 x fp32), sharded", 2 * FLOAT32 * total / gpus),
        ("root gathered (embeddings, tied LM head)", act * root),
        ("two blocks gathered (current + prefetch)", 2 * act * block),
        ("one block's unsharded fp32 gradient", FLOAT32 * block),
        ("checkpointed block inputs (n_layer x B x T x E)", cfg.n_layer * tokens * cfg.d_model * act),
        ("one block recomputed, x2 for its gradients", 2 * tokens * block_bytes_per_token(cfg, act)),
        ("EVA tile group working set (4 fp32 temporaries)", eva_working_set(shape) if cfg.attention == "eva" else 0),
        ("logits + fp32 log-softmax + gradient (10 B each)", 10 * tokens * cfg.vocab_size),
        ("runtime allowance", RUNTIME_ALLOWANCE),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """`evalm train memory`: the plan of each config, one line per term."""
    from evalm.config_toolkit import Parser

    p = Parser(prog="evalm train memory", description="Expected memory per GPU of a pretraining config under FSDP2 "
               "+ activation checkpointing, computed from the config alone (nothing is allocated).")
    p.add_argument("configs", nargs="*", default=["configs/evalm-350m.toml", "configs/evalm-1.3b.toml"],
                   help="pretraining TOML files (default: configs/evalm-350m.toml configs/evalm-1.3b.toml)")
    p.add_argument("--gpus", type=int, default=8, help="GPUs FSDP shards over (default: 8)")
    args = p.parse_args(argv)
    if args.gpus < 1:
        p.error(f"--gpus must be >= 1, got {args.gpus}")
    for path in args.configs:
        shape = Shape.read(path)
        block, root = parameter_counts(shape.model)
        terms = plan(shape, args.gpus)
        print(f"== {path}: {shape.model.n_layer * block + root:,} parameters, {shape.micro_batch} x {shape.seq_len} "
              f"tokens per GPU, {'bf16' if shape.bf16 else 'fp32'}, FSDP2 over {args.gpus} GPUs, activation checkpointing")
        for name, size in terms:
            print(f"  {name:<52} {size / GiB:>7.2f} GiB")
        print(f"  {'total per GPU':<52} {sum(s for _, s in terms) / GiB:>7.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
