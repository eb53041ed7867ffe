"""Expected memory per GPU for a pretraining config under FSDP2 + activation checkpointing.

Run: python benchmarks/memory_plan.py [configs/evalm-350m.toml configs/evalm-1.3b.toml] [--gpus 8]

Computed from the config only (nothing is allocated), so a user can size a cluster before renting
it. The terms follow what train/parallelize.py builds: every Block and then the root are
`fully_shard`ed (ZeRO-3), blocks reshard after forward, the root (embeddings, final norm, tied
LM head) stays gathered; bf16 compute with fp32 master parameters, fp32 gradient reduction and
AdamW's two fp32 moments; each Block is checkpointed, so the backward keeps every block's input
and recomputes one block at a time. EVA's attention keeps O(n·D) per layer (evalm/recompute.py),
never the O(n·(w + n/c)) logits. Activation terms are estimates in bytes per token, listed below;
add the CUDA context and allocator fragmentation (the last line's allowance) before comparing
with a card's capacity.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from evalm.config_toolkit import build, read_toml
from evalm import EvalmModel, ModelConfig
from evalm.recompute import MIN_PIECE
from evalm.tiling import GROUP_LOGITS

GIB = 2**30
RUNTIME_ALLOWANCE = 2 * GIB  # CUDA context, NCCL buffers, allocator fragmentation (an allowance, not a measurement)


@dataclass(frozen=True)
class Shape:
    """What the plan needs from a config file."""

    model: ModelConfig
    micro_batch: int  # lines per GPU per forward ([train] batch_size)
    seq_len: int  # tokens per line ([data] seq_len)
    bf16: bool

    @classmethod
    def read(cls, path: str) -> Shape:
        raw = read_toml(path)
        model = build(ModelConfig, raw["model"], where=f"{path} [model]")
        train = raw.get("train", {})
        return cls(model, int(train.get("batch_size", 1)), int(raw.get("data", {}).get("seq_len", 8192)),
                   train.get("mixed_precision", "fp32") == "bf16")


def parameter_counts(config: ModelConfig) -> tuple[int, int]:
    """(parameters of one Block, parameters of the root: embeddings, positions, final norm), counted
    on a meta-device model so the count is the code's, not a formula's."""
    import torch

    with torch.device("meta"):
        model = EvalmModel(config)
    block = sum(p.numel() for p in model.blocks[0].parameters())
    return block, model.num_params() - config.n_layer * block


def block_bytes_per_token(config: ModelConfig, act: int) -> int:
    """Activations one Block holds per token while it is recomputed in backward (act bytes each).

    attn_norm out, q, k, v, attention out, out_proj out, residual, mlp_norm out (8E); fc1 out and
    the ReLU out fc2 reads (2F); two dropout masks (1 byte each, E); the per-row log-sum-exp (fp32,
    H); EVA's chunk state, recomputed in backward rather than kept (k̃, ω, β and the gradients of
    k̃, β, ω: 6E/c while the attention's backward runs). Gradients of the same tensors are in flight
    at once, so the plan counts the block twice.
    """
    E, F, H, c = config.d_model, config.d_ff, config.n_head, config.chunk_size
    return act * (8 * E + 2 * F + 6 * E // c) + 2 * E + 4 * H


def eva_working_set(shape: Shape) -> int:
    """Bytes of one tile group's fp32 temporaries (logits, probabilities, their gradient, the
    dropout mask): a group is at most GROUP_LOGITS logits, since a block over more is cut into
    pieces of rows (evalm/recompute.py), never thinner than MIN_PIECE rows."""
    cfg = shape.model
    ext = cfg.window_size if cfg.overlap_window else 0
    thinnest = shape.micro_batch * cfg.n_head * MIN_PIECE * (ext + cfg.window_size + shape.seq_len // cfg.chunk_size)
    return 4 * 4 * max(GROUP_LOGITS, thinnest)


def plan(shape: Shape, gpus: int) -> list[tuple[str, float]]:
    """(term, bytes) per GPU."""
    cfg = shape.model
    block, root = parameter_counts(cfg)
    total = cfg.n_layer * block + root
    act = 2 if shape.bf16 else 4
    tokens = shape.micro_batch * shape.seq_len
    logits = tokens * cfg.vocab_size
    return [
        ("fp32 parameters, sharded", 4 * total / gpus),
        ("fp32 gradients, sharded", 4 * total / gpus),
        ("AdamW moments (2 x fp32), sharded", 8 * total / gpus),
        ("root gathered (embeddings, tied LM head)", act * root),
        ("two blocks gathered (current + prefetch)", 2 * act * block),
        ("one block's unsharded fp32 gradient", 4 * block),
        ("checkpointed block inputs (n_layer x B x T x E)", cfg.n_layer * tokens * cfg.d_model * act),
        ("one block recomputed, x2 for its gradients", 2 * tokens * block_bytes_per_token(cfg, act)),
        ("EVA tile group working set (4 fp32 temporaries)", eva_working_set(shape) if cfg.attention == "eva" else 0),
        ("logits + fp32 log-softmax + gradient (10 B each)", 10 * logits),
        ("runtime allowance", RUNTIME_ALLOWANCE),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", nargs="*", default=["configs/evalm-350m.toml", "configs/evalm-1.3b.toml"],
                        help="pretraining TOML files (default configs/evalm-350m.toml configs/evalm-1.3b.toml)")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs FSDP shards over (default 8)")
    args = parser.parse_args()
    for path in args.configs:
        shape = Shape.read(path)
        block, root = parameter_counts(shape.model)
        terms = plan(shape, args.gpus)
        print(f"== {path}: {shape.model.n_layer * block + root:,} parameters, {shape.micro_batch} x {shape.seq_len} "
              f"tokens per GPU, {'bf16' if shape.bf16 else 'fp32'}, FSDP2 over {args.gpus} GPUs, activation checkpointing")
        for name, size in terms:
            print(f"  {name:<52} {size / GIB:>7.2f} GiB")
        print(f"  {'total per GPU':<52} {sum(s for _, s in terms) / GIB:>7.2f} GiB")


if __name__ == "__main__":
    main()
