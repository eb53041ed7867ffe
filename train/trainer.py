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
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from evalm.config_toolkit import ConfigError, UserError, to_dict
from evalm.storage import Ranks, RunFolder, read_json, write_atomic
from evalm.train import checkpoint, interrupt
from evalm.train.config import RunConfig
from evalm.train.structure import Packed
from evalm.train.data import IGNORE, LineLoader, LineSource
from evalm.config_toolkit.machine import peak_memory_gib
from evalm.train.metrics import MetricsLogger, flops_per_token, matmul_params, peak_flops
from evalm.train.parallelize import Runtime, build_model, init_distributed, weight_decay_groups
from evalm.train.schedule import set_lr
from evalm.train.state import TrainState


@dataclass(frozen=True)
class Session:
    """What every part of one run shares: its config, folder, process group, logger, and the
    model, optimizer and loader built for it."""

    config: RunConfig
    folder: RunFolder
    """The run folder (its lock held by rank 0): config.json, metrics, checkpoints."""
    runtime: Runtime
    logger: MetricsLogger
    config_json: dict[str, Any]
    """The resolved config written beside every checkpoint, with the run's identity."""
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loader: LineLoader
    step: Callable
    """One optimizer step: `train_step`, or what `run(step=...)` gave."""


def run(config: RunConfig, out: str | Path, make_source: Callable[[Runtime], LineSource], *,
        resume: str = "none", command: str = "pretrain", build: Callable | None = None,
        step: Callable | None = None) -> list[dict[str, Any]]:
    """Train to `config.train.steps`; returns rank 0's log records (empty on other ranks). `build(config,
    runtime)` makes the sharded model in place of an `EvalmModel` of `[model]`, `step` replaces
    `train_step` (same arguments and result): `evalm train uptrain` (train/uptrain.py) passes both."""
    runtime = init_distributed(config.train.device)
    folder = RunFolder(out, f"evalm train {command}", Ranks(runtime.rank, runtime.world_size,
                                                           _broadcast if runtime.world_size > 1 else None),
                       inputs=config.inputs())
    logger = MetricsLogger(folder.path, enabled=False, tensorboard=False)
    try:
        with folder.held():  # one owner per run folder: rank 0 holds it for the whole run, for every rank
            logger = MetricsLogger(folder.path, enabled=runtime.is_main, tensorboard=config.train.tensorboard)
            resume_path = _resume_path(folder, resume, logger)
            return _train(config, folder, make_source, resume_path, command, runtime, logger, build, step)
    finally:  # no barrier here: after an error on one rank, the others must not wait for it
        logger.close()
        dist.destroy_process_group()
        # The group's worker threads stop only when its last reference goes, and the mesh holds one. This
        # frame outlives the call inside an error's traceback; a worker still releasing the last collective's
        # tensors then waits for the GIL until the interpreter exits, and aborts the process (SIGABRT
        # instead of exit 2, one run in five after a failure shared by rank 0).
        del runtime


def _broadcast(box: list) -> None:
    dist.broadcast_object_list(box, src=0)  # our own process group's bytes, not a file's


def _train(config: RunConfig, folder: RunFolder, make_source: Callable[[Runtime], LineSource],
           resume_path: Path | None, command: str, runtime: Runtime, logger: MetricsLogger,
           build: Callable | None = None, step: Callable | None = None) -> list[dict[str, Any]]:
    tcfg = config.train
    grouped = config.data.structure == "saicl"  # train.structure: one FSDP unit
    if grouped and tcfg.activation_checkpointing:
        raise ConfigError("data.structure='saicl' encodes through caches that the test pass reads inside "
                          "each block; set train.activation_checkpointing=false")
    model = build(config, runtime) if build else build_model(
        config.model, runtime, seed=tcfg.seed, bf16=tcfg.mixed_precision == "bf16",
        activation_checkpointing=tcfg.activation_checkpointing, shard_blocks=not grouped, compile_blocks=tcfg.compile)
    optimizer = make_optimizer(model, config.optim)
    source = make_source(runtime)
    loader = LineLoader(source, rank=runtime.rank, world_size=runtime.world_size,
                        batch_size=tcfg.batch_size, shuffle=config.data.shuffle, seed=config.data.seed)
    identity = folder.share(lambda: config.identity(folder.identity))  # rank 0 reads the files
    config_json = {"command": command, "world_size": runtime.world_size, **config.to_json(), "identity": identity}
    session = Session(config, folder, runtime, logger, config_json, model, optimizer, loader, step or train_step)
    state = _start(session, resume_path)
    model.train()
    records = _loop(session, state)
    dist.barrier()
    return records


def _resume_path(folder: RunFolder, resume: str, logger: MetricsLogger) -> Path | None:
    """Where to continue from (rank 0 verifies the checkpoints once, for all ranks); a fresh run may
    not write over a run folder's checkpoints."""
    out = folder.path

    def find() -> Path | None:
        path = checkpoint.find_resume_path(out, resume, note=logger.info)
        if path is None and resume in ("", "none") and checkpoint.complete_checkpoints(out):
            raise checkpoint.CheckpointError(
                f"{out} already holds checkpoints; pass --resume auto to continue that run, or another --out")
        return path

    return folder.share(find)


def _start(session: Session, resume_path: Path | None) -> TrainState:
    """Resume (model, optimizer, counters, cursor, RNG), or start fresh (optionally from init_from)."""
    config, folder, runtime, logger = session.config, session.folder, session.runtime, session.logger
    model_json = json.loads(json.dumps(to_dict(config.model)))  # as the checkpoint holds it: tuples are lists
    if resume_path is not None:
        checkpoint.check_architecture(resume_path, model_json)
        checkpoint.check_identity(resume_path, session.config_json["identity"])
        entry, rank_state = checkpoint.load(resume_path, model=session.model, optimizer=session.optimizer)
        state = TrainState.from_checkpoint(entry)
        if rank_state is not None:
            checkpoint.set_rng_state(rank_state["rng"])
        else:  # a new rank (world grew): its own dropout stream
            _seed_rank(config.train.seed, runtime.rank, state.step)
        # the same global position on every rank, whatever the world size or batch was or is now
        session.loader.seek(_saved_position(resume_path, entry, rank_state))
        if runtime.is_main:
            _truncate_metrics(folder.path / "metrics.jsonl", state.step)
            folder.write_json("config.json", session.config_json)
        logger.info(f"resumed from {resume_path} at step {state.step}")
        return state
    if config.checkpoint.init_from:
        source = checkpoint.resolve_checkpoint(config.checkpoint.init_from, note=logger.info)
        checkpoint.check_architecture(source, model_json)
        checkpoint.load_model_only(source, session.model)
        logger.info(f"initialised the model from {source}")
    if runtime.is_main:
        folder.write_json("config.json", session.config_json)
        (folder.path / "metrics.jsonl").unlink(missing_ok=True)
    _seed_rank(config.train.seed, runtime.rank, 0)
    return TrainState()


def _saved_position(path: Path, train_state: dict[str, int], rank_state: dict | None) -> int:
    """Lines all ranks had consumed at the checkpoint. Checkpoints from before `lines` was saved:
    a surviving rank's cursor x world size, else step x the global batch of its config.json."""
    if "lines" in train_state:
        return int(train_state["lines"])
    if rank_state is not None:
        return int(rank_state["data"]["cursor"]) * int(rank_state["data"]["world_size"])
    saved = read_json(path / "config.json")
    return int(train_state["step"]) * saved["train"]["batch_size"] * saved["train"]["grad_accum"] * saved["world_size"]


def _seed_rank(seed: int, rank: int, step: int) -> None:
    """Per-rank dropout/noise streams: the same weights everywhere, different dropout masks."""
    s = seed + 1 + rank + 1_000_003 * step
    random.seed(s)
    np.random.seed(s % 2**32)
    torch.manual_seed(s)


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop records past the resumed step (a killed run may have logged steps it never saved), and a
    last line cut short by the kill."""
    if path.is_file():
        kept = []
        for line in path.read_text().splitlines():
            try:
                if line and json.loads(line)["step"] <= step:
                    kept.append(line)
            except (ValueError, KeyError, TypeError):
                continue
        write_atomic(path, "".join(f"{line}\n" for line in kept))


class NonFiniteLoss(UserError, RuntimeError):
    """Training produced a non-finite loss, gradient or weight; the message names the step."""


def _loop(session: Session, state: TrainState) -> list[dict]:
    """Steps to the end: set the LR, step, log every log_every, save every save_every. Ctrl-C ends
    the run between steps (train.interrupt); a non-finite step stops it before anything is saved."""
    config, runtime, loader, model = session.config, session.runtime, session.loader, session.model
    tcfg, ocfg, ccfg = config.train, config.optim, config.checkpoint
    seq_len = loader.source.seq_len
    structure = getattr(loader.source, "structure", None) or Packed()  # train.structure: how lines are fed
    tokens_per_step = tcfg.batch_size * tcfg.grad_accum * seq_len * runtime.world_size
    meter = _Meter(session, state.step, tokens_per_step)
    bar = tqdm(total=tcfg.steps, initial=state.step, desc=session.config_json["command"], unit="step",
               file=sys.stderr, disable=not runtime.is_main, dynamic_ncols=True)
    with interrupt.deferred(), bar:  # the bar ends its line before any error is printed
        while state.step < tcfg.steps:
            lr = set_lr(session.optimizer, state.step, ocfg, tcfg.steps)
            loss, grad_norm, applied = session.step(model, session.optimizer, loader, runtime, tcfg.grad_accum,
                                                    ocfg.clip_norm, structure)
            state.step += 1
            state.tokens_seen += tokens_per_step
            if not applied:
                _nonfinite(state, loss, grad_norm, tcfg, session.logger)
            elif not _weights_finite(model, runtime):
                raise NonFiniteLoss(f"step {state.step}: the update made the weights non-finite (loss before it "
                                    f"{loss:.4g}, gradient norm {grad_norm:.4g}; optim.lr={ocfg.lr:g} too high?); "
                                    f"nothing of this step was saved: the last checkpoint under "
                                    f"{session.folder.path}/checkpoints is finite")
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
            if state.step % tcfg.log_every == 0 or state.step == tcfg.steps:
                meter.log(state, loss=loss, lr=lr, grad_norm=grad_norm)
            if (ccfg.save_every and state.step % ccfg.save_every == 0) or state.step == tcfg.steps:
                checkpoint.save(session.folder.path, state.step, model=model, optimizer=session.optimizer,
                                train_state=state.checkpoint_entry(loader.position),
                                rank_state={"data": loader.state_dict(), "rng": checkpoint.rng_state()},
                                config_json=session.config_json, keep_latest_k=ccfg.keep_latest_k)
            if interrupt.stop_requested(runtime.device):
                raise KeyboardInterrupt
    return meter.records


class _Meter:
    """Throughput, MFU and ETA between log steps; writes each record (rank 0 keeps them)."""

    def __init__(self, session: Session, step: int, tokens_per_step: int):
        config, seq_len = session.config, session.loader.source.seq_len
        self.session, self.tokens_per_step = session, tokens_per_step
        counts = flops_per_token(matmul_params(session.model), config.model, seq_len)
        self.flops, self.flops_torchtitan = counts["total"], counts["torchtitan"]
        self.peak = peak_flops(session.runtime.device)
        self.last_time, self.last_step = time.perf_counter(), step
        self.records: list[dict] = []

    def log(self, state: TrainState, **values: float) -> None:
        runtime, total = self.session.runtime, self.session.config.train.steps
        now = time.perf_counter()
        steps = state.step - self.last_step
        tok_s = self.tokens_per_step * steps / max(now - self.last_time, 1e-9)
        record = {"step": state.step, "total_steps": total, **values, "tokens_per_s": tok_s,
                  "mfu": None if self.peak is None else tok_s * self.flops / (self.peak * runtime.world_size),
                  "mfu_torchtitan": None if self.peak is None else tok_s * self.flops_torchtitan / (self.peak * runtime.world_size),
                  "peak_mem_gib": peak_memory_gib(runtime.device), "tokens_seen": state.tokens_seen,
                  "epoch": self.session.loader.epoch, "eta_s": (now - self.last_time) / steps * (total - state.step),
                  "nonfinite_skips": state.nonfinite_skips}
        self.session.logger.log(record)
        if runtime.is_main:
            self.records.append(record)
        self.last_time, self.last_step = now, state.step


def _nonfinite(state: TrainState, loss: float, grad_norm: float, tcfg, logger: MetricsLogger) -> None:
    """A batch whose loss or gradient was non-finite was not applied: skip it (train.nonfinite=skip, at
    most train.max_nonfinite_skips times in the run, counted in the checkpoint and the metrics) or stop."""
    what = f"step {state.step}: the loss is {loss:.4g} and the gradient norm {grad_norm:.4g}"
    if tcfg.nonfinite == "skip" and state.nonfinite_skips < tcfg.max_nonfinite_skips:
        state.nonfinite_skips += 1
        logger.info(f"{what}; batch skipped without an update ({state.nonfinite_skips} of at most "
                    f"{tcfg.max_nonfinite_skips}, train.max_nonfinite_skips)")
        return
    why = ("" if tcfg.nonfinite == "stop" else
           f" after {state.nonfinite_skips} skipped batches (train.max_nonfinite_skips)")
    raise NonFiniteLoss(f"{what}{why}; stopped before updating or saving, so the last checkpoint is finite. "
                        "Lower optim.lr or check the data; --set train.nonfinite=skip skips such batches a bounded "
                        "number of times")


def _weights_finite(model: torch.nn.Module, runtime: Runtime) -> bool:
    """Whether every parameter of every rank is finite (each rank checks its shards; one all-reduce)."""
    local = all(bool(torch.isfinite(p.to_local() if hasattr(p, "to_local") else p).all())
                for p in model.parameters())
    flag = torch.tensor(float(local), device=runtime.device)
    _min_over_ranks(flag)
    return bool(flag.item())


def make_optimizer(model: torch.nn.Module, ocfg) -> torch.optim.AdamW:
    """AdamW of the `[optim]` section over `weight_decay_groups` (biases and norm weights undecayed)."""
    return torch.optim.AdamW(weight_decay_groups(model, ocfg.weight_decay), lr=ocfg.lr, betas=tuple(ocfg.betas),
                             eps=ocfg.eps)


def _sum_over_ranks(t: torch.Tensor) -> None:
    """all_reduce in a process group; one process without a group (train.local) holds the sum already."""
    if dist.is_initialized():
        dist.all_reduce(t)


def _min_over_ranks(t: torch.Tensor) -> None:
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MIN)


def train_step(model, optimizer, loader: LineLoader, runtime: Runtime, grad_accum: int,
               clip_norm: float, structure=None) -> tuple[float, float, bool]:
    """One optimizer step; returns the step's mean loss over all ranks, the pre-clip grad norm, and
    whether the update was applied: not when the loss or the gradient is non-finite (the same global
    values on every rank, so every rank decides alike)."""
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
    return finish_step(model, optimizer, runtime, loss_sum, n_targets, clip_norm)


def finish_step(model, optimizer, runtime: Runtime, loss_sum: torch.Tensor, count: float,
                clip_norm: float) -> tuple[float, float, bool]:
    """After a step's backward: clip, and apply the update unless the loss (this rank's `loss_sum`,
    summed over ranks, over `count`) or the gradient norm is non-finite; the step's loss, the
    pre-clip norm, whether it was applied (the same global values on every rank)."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm if clip_norm > 0 else float("inf"))
    if hasattr(grad_norm, "full_tensor"):
        grad_norm = grad_norm.full_tensor()
    _sum_over_ranks(loss_sum)
    loss, norm = loss_sum.item() / count, float(grad_norm)
    applied = math.isfinite(loss) and math.isfinite(norm)
    if applied:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss, norm, applied
