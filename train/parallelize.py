"""Distribution applied from outside the model: process group, device mesh, AC, FSDP2.

The model knows nothing of distribution. `build_model` wraps each `Block` for
activation checkpointing if asked, shards each `Block` with `fully_shard` and then the root
(torchtitan v0.2.0 `apply_fsdp`). On GPU it builds on the meta device and initialises only the
local shards, so no rank holds the full model (EVALM §3.2 uses FSDP for 8k lines at 1.3B).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from evalm import EvalmModel, ModelConfig


@dataclass(frozen=True)
class Runtime:
    """Where this process runs: rank, world, device, and the 1-D mesh FSDP shards over."""

    rank: int
    world_size: int
    device: torch.device
    mesh: DeviceMesh

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str = "auto") -> Runtime:
    """Join the torchrun process group (RANK/WORLD_SIZE set), or make a one-process group.

    One entry point for both launches (nanochat `compute_init`): a plain `python -m evalm.train.pretrain`
    is a world of one, so the same FSDP and DCP code runs. gloo on CPU, NCCL on GPU.
    """
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    backend = "nccl" if use_cuda else "gloo"
    if not dist.is_initialized():
        timeout = datetime.timedelta(minutes=30)
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend, timeout=timeout)
        else:  # a world of one needs no rendezvous: an in-process store
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    if use_cuda:
        local = int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count()))
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
    mesh = init_device_mesh(dev.type, (world,), mesh_dim_names=("dp",))
    return Runtime(rank, world, dev, mesh)


def apply_activation_checkpointing(model: EvalmModel) -> None:
    """Recompute each block in backward; non-reentrant, and it replays dropout's RNG exactly."""
    for i, block in enumerate(model.blocks):
        model.blocks[i] = checkpoint_wrapper(block, preserve_rng_state=True)


def apply_compile(model: EvalmModel) -> None:
    """Compile each block in place (`nn.Module.compile`: its parameter names, so checkpoints, do not change).
    Per block rather than the whole model, as torchtitan does: one compiled graph serves every block of a
    shape, and FSDP's per-block hooks stay outside it. dynamic=False, as flex.py compiles its kernel: at a
    second sequence length dynamo would otherwise recompile with symbolic lengths, which the flex route's
    lowering does not take (an InductorError; tests/train/test_compile.py)."""
    for block in model.blocks:
        block.compile(dynamic=False)


def apply_fsdp(model: EvalmModel, mesh: DeviceMesh, *, bf16: bool, shard_blocks: bool = True) -> None:
    """`fully_shard` each block, then the root (which holds embeddings, final norm, lm_head).

    Blocks reshard after forward (ZeRO-3: gather again in backward) to keep 8k-token activations
    room; the root's parameters are needed first in backward, so it keeps them gathered. bf16 runs
    compute in bf16 while parameters stay fp32 and gradients reduce in fp32.

    `shard_blocks=False` makes the whole model one unit. Tuning under the SAICL mask needs it
    (train/structure.py): its test pass reaches the demonstrations' keys and values inside each
    block, past the block's FSDP hooks, so a block resharded or reduced after its test pass would
    free weights, or drop gradients, that the demonstrations' backward still needs. Gradients are
    then reduced once, after the whole backward (measured: equal to an unsharded model's on 2 ranks).
    """
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    for block in model.blocks if shard_blocks else ():
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)


@dataclass(frozen=True)
class BuildPlan:
    """How `build_model` makes a model: the init seed, bf16 compute, activation checkpointing, an FSDP
    unit per block (False: one for the whole model, train.structure's SAICL mask), compiled blocks."""

    seed: int = 0
    bf16: bool = False
    activation_checkpointing: bool = False
    shard_blocks: bool = True
    compile_blocks: bool = False


def build_model(config: ModelConfig, runtime: Runtime, plan: BuildPlan = BuildPlan()) -> EvalmModel:
    """The sharded model, initialised from `plan.seed` identically on every rank and for every world size.

    On CUDA: meta construction, AC, FSDP, then allocate and initialise the local shards (DTensor's
    RNG tracker gives each shard its slice of one global random stream). On CPU that tracker is
    not supported and every rank would draw the same values into its own shard (measured: rank 0
    and rank 1 held identical embedding rows), so there the full model is initialised first and
    then sharded.
    """
    on_meta = runtime.device.type == "cuda"
    with torch.device("meta" if on_meta else runtime.device):
        model = EvalmModel(config)
    if not on_meta:
        torch.manual_seed(plan.seed)
        model.init_weights()
    if plan.activation_checkpointing:
        apply_activation_checkpointing(model)
    if plan.compile_blocks:
        apply_compile(model)
    apply_fsdp(model, runtime.mesh, bf16=plan.bf16, shard_blocks=plan.shard_blocks)
    if on_meta:
        model.to_empty(device=runtime.device)
        torch.manual_seed(plan.seed)
        model.init_weights()
    return model


def weight_decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices and embeddings; not biases or LayerNorm weights (1-D), as in GPT-2/nanoGPT."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
