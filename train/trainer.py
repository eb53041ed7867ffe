"""The training loop shared by pretraining and MSIT: build, resume, step, log, checkpoint.

One step (EVALM Table 6): `grad_accum` micro-batches of `batch_size` lines per rank, the loss a
token-weighted mean over every rank's targets (see [token mean note]), AdamW with the LR of
`schedule.lr_at(step)`, L2 gradient clipping at 1.0. Everything a resumed run needs to continue
bit for bit is in the checkpoint: sharded model and optimizer, step, tokens seen, and per rank the
loader cursor and the RNG states (dropout and EVA's noise draw from torch's RNG).

[token mean note] With loss masks (MSIT) ranks and micro-batches hold different numbers of
targets, so a mean of per-batch means would weight tokens unequally. Each micro-batch therefore
backpropagates its loss *sum* x world / (targets in the whole step, all ranks): FSDP's
reduce-scatter averages over ranks, which turns that into the exact mean over the step.
"""

from __future__ import annotations

import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from evalm.config_toolkit import to_dict
from evalm.train import checkpoint
from evalm.train.config import RunConfig
from evalm.train.structure import Packed
from evalm.train.data import IGNORE, LineLoader, LineSource
from evalm.train.metrics import MetricsLogger, flops_per_token, peak_flops, peak_memory_gib
from evalm.train.parallelize import Runtime, build_model, init_distributed, weight_decay_groups
from evalm.train.schedule import set_lr


def run(config: RunConfig, out: str | Path, make_source: Callable[[Runtime], LineSource], *,
        resume: str = "none", command: str = "pretrain") -> list[dict[str, Any]]:
    """Train to `config.train.steps`; returns rank 0's log records (empty on other ranks)."""
    tcfg, ocfg = config.train, config.optim
    runtime = init_distributed(tcfg.device)
    out = Path(out)
    logger = MetricsLogger(out, enabled=runtime.is_main, tensorboard=tcfg.tensorboard)
    try:
        resume_path = _resume_path(out, resume, runtime)
        grouped = getattr(config.data, "structure", "packed") == "saicl"  # train.structure: one FSDP unit
        if grouped and tcfg.activation_checkpointing:
            raise ValueError("data.structure='saicl' encodes through caches that the test pass reads inside "
                             "each block; set train.activation_checkpointing=false")
        model = build_model(config.model, runtime, seed=tcfg.seed, bf16=tcfg.mixed_precision == "bf16",
                            activation_checkpointing=tcfg.activation_checkpointing, shard_blocks=not grouped)
        optimizer = make_optimizer(model, ocfg)
        source = make_source(runtime)
        data_cfg = config.data
        loader = LineLoader(source, rank=runtime.rank, world_size=runtime.world_size,
                            batch_size=tcfg.batch_size, shuffle=data_cfg.shuffle, seed=data_cfg.seed)
        config_json = {"command": command, "world_size": runtime.world_size, **config.to_json()}
        step, tokens_seen = _start(config, out, resume_path, model, optimizer, loader, runtime, logger, config_json)
        model.train()
        records = _loop(config, out, model, optimizer, loader, runtime, logger, config_json, step, tokens_seen)
        dist.barrier()
        return records
    finally:  # no barrier here: after an error on one rank, the others must not wait for it
        logger.close()
        dist.destroy_process_group()


def _resume_path(out: Path, resume: str, runtime: Runtime) -> Path | None:
    """Where to continue from; a fresh run may not write over a run folder's checkpoints."""
    path = checkpoint.find_resume_path(out, resume)
    if path is None and resume in ("", "none") and checkpoint.complete_checkpoints(out):
        raise checkpoint.CheckpointError(
            f"{out} already holds checkpoints; pass --resume auto to continue that run, or another --out")
    if runtime.is_main:
        out.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    return path


def _start(config: RunConfig, out: Path, resume_path: Path | None, model, optimizer, loader: LineLoader,
           runtime: Runtime, logger: MetricsLogger, config_json: dict) -> tuple[int, int]:
    """Resume (model, optimizer, step, cursor, RNG), or start fresh (optionally from init_from)."""
    model_json = to_dict(config.model)
    if resume_path is not None:
        checkpoint.check_architecture(resume_path, model_json)
        train_state, rank_state = checkpoint.load(resume_path, model=model, optimizer=optimizer)
        step = int(train_state["step"])
        if rank_state is not None:
            checkpoint.set_rng_state(rank_state["rng"])
        else:  # a new rank (world grew): its own dropout stream
            _seed_rank(config.train.seed, runtime.rank, step)
        # the same global position on every rank, whatever the world size or batch was or is now
        loader.seek(_saved_position(resume_path, train_state, rank_state))
        if runtime.is_main:
            _truncate_metrics(out / "metrics.jsonl", step)
            (out / "config.json").write_text(json.dumps(config_json, indent=2))
        logger.info(f"resumed from {resume_path} at step {step}")
        return step, int(train_state["tokens_seen"])
    if config.checkpoint.init_from:
        source = checkpoint.resolve_checkpoint(config.checkpoint.init_from)
        checkpoint.check_architecture(source, model_json)
        checkpoint.load_model_only(source, model)
        logger.info(f"initialised the model from {source}")
    if runtime.is_main:
        (out / "config.json").write_text(json.dumps(config_json, indent=2))
        (out / "metrics.jsonl").unlink(missing_ok=True)
    _seed_rank(config.train.seed, runtime.rank, 0)
    return 0, 0


def _saved_position(path: Path, train_state: dict[str, int], rank_state: dict | None) -> int:
    """Lines all ranks had consumed at the checkpoint. Checkpoints from before `lines` was saved:
    a surviving rank's cursor x world size, else step x the global batch of its config.json."""
    if "lines" in train_state:
        return int(train_state["lines"])
    if rank_state is not None:
        return int(rank_state["data"]["cursor"]) * int(rank_state["data"]["world_size"])
    saved = json.loads((path / "config.json").read_text())
    return int(train_state["step"]) * saved["train"]["batch_size"] * saved["train"]["grad_accum"] * saved["world_size"]


def _seed_rank(seed: int, rank: int, step: int) -> None:
    """Per-rank dropout/noise streams: the same weights everywhere, different dropout masks."""
    s = seed + 1 + rank + 1_000_003 * step
    random.seed(s)
    np.random.seed(s % 2**32)
    torch.manual_seed(s)


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop records past the resumed step (a killed run may have logged steps it never saved)."""
    if path.is_file():
        kept = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        path.write_text("".join(f"{line}\n" for line in kept))


def _loop(config: RunConfig, out: Path, model, optimizer, loader: LineLoader, runtime: Runtime,
          logger: MetricsLogger, config_json: dict, step: int, tokens_seen: int) -> list[dict]:
    """Steps from `step` to the end: set the LR, step, log every log_every, save every save_every."""
    tcfg, ocfg, ccfg = config.train, config.optim, config.checkpoint
    seq_len = loader.source.seq_len
    structure = getattr(loader.source, "structure", None) or Packed()  # train.structure: how lines are fed
    tokens_per_step = tcfg.batch_size * tcfg.grad_accum * seq_len * runtime.world_size
    flops = flops_per_token(sum(p.numel() for p in model.parameters()), config.model.n_layer,
                            config.model.d_model, seq_len)
    peak = peak_flops(runtime.device)
    records: list[dict] = []
    last_time, last_step = time.perf_counter(), step
    bar = tqdm(total=tcfg.steps, initial=step, desc=config_json["command"], unit="step", file=sys.stderr,
               disable=not runtime.is_main, dynamic_ncols=True)
    while step < tcfg.steps:
        lr = set_lr(optimizer, step, ocfg, tcfg.steps)
        loss, grad_norm = train_step(model, optimizer, loader, runtime, tcfg.grad_accum, ocfg.clip_norm, structure)
        step += 1
        tokens_seen += tokens_per_step
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
        if step % tcfg.log_every == 0 or step == tcfg.steps:
            now = time.perf_counter()
            tok_s = tokens_per_step * (step - last_step) / max(now - last_time, 1e-9)
            record = {"step": step, "total_steps": tcfg.steps, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                      "tokens_per_s": tok_s, "mfu": None if peak is None else tok_s * flops / (peak * runtime.world_size),
                      "peak_mem_gib": peak_memory_gib(runtime.device), "tokens_seen": tokens_seen,
                      "epoch": loader.epoch, "eta_s": (now - last_time) / (step - last_step) * (tcfg.steps - step)}
            logger.log(record)
            if runtime.is_main:
                records.append(record)
            last_time, last_step = now, step
        if (ccfg.save_every and step % ccfg.save_every == 0) or step == tcfg.steps:
            checkpoint.save(out, step, model=model, optimizer=optimizer,
                            train_state={"step": step, "tokens_seen": tokens_seen, "lines": loader.position},
                            rank_state={"data": loader.state_dict(), "rng": checkpoint.rng_state()},
                            config_json=config_json, keep_latest_k=ccfg.keep_latest_k)
    bar.close()
    return records


def make_optimizer(model: torch.nn.Module, ocfg) -> torch.optim.AdamW:
    """AdamW of the `[optim]` section over `weight_decay_groups` (biases and norm weights undecayed)."""
    return torch.optim.AdamW(weight_decay_groups(model, ocfg.weight_decay), lr=ocfg.lr, betas=tuple(ocfg.betas),
                             eps=ocfg.eps)


def _sum_over_ranks(t: torch.Tensor) -> None:
    """all_reduce in a process group; one process without a group (train.local) holds the sum already."""
    if dist.is_initialized():
        dist.all_reduce(t)


def train_step(model, optimizer, loader: LineLoader, runtime: Runtime, grad_accum: int,
               clip_norm: float, structure=None) -> tuple[float, float]:
    """One optimizer step; returns the step's mean loss over all ranks and the pre-clip grad norm."""
    structure = structure or Packed()
    batches = [structure.prepare(*loader.next_batch()) for _ in range(grad_accum)]
    # collectives need tensors on the backend's device (NCCL: CUDA)
    count = torch.tensor(float(sum(int((t != IGNORE).sum()) for _, t in batches)), device=runtime.device)
    _sum_over_ranks(count)
    n_targets = max(count.item(), 1.0)  # a step with no target contributes zero gradient
    loss_sum = torch.zeros((), dtype=torch.float64, device=runtime.device)
    for inputs, targets in batches:
        logits = structure.logits(model, inputs, runtime.device)
        micro = F.cross_entropy(logits.float().flatten(0, 1), targets.to(runtime.device).flatten(),
                                ignore_index=IGNORE, reduction="sum")
        (micro * (runtime.world_size / n_targets)).backward()  # [token mean note]
        loss_sum += micro.detach().double()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm if clip_norm > 0 else float("inf"))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    _sum_over_ranks(loss_sum)
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    return loss_sum.item() / n_targets, float(grad_norm)
