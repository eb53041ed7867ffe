"""A training run of pretraining, MSIT or uptraining: build, resume, step (train/loop.py), log, checkpoint.

One step (EVALM Table 6): `grad_accum` micro-batches of `batch_size` lines per rank, the loss a
token-weighted mean over every rank's targets (train/loop.py, [token mean note]), AdamW with the LR of
`schedule.lr_at(step)`, L2 gradient clipping at 1.0; the steps run in the project's one loop
(`loop.run_steps`), this module adding what follows each. Everything a resumed run needs to continue
bit for bit is in the checkpoint: sharded model and optimizer, step, tokens seen, and per rank the
loader cursor and the RNG states (dropout and EVA's noise draw from torch's RNG).
"""

from __future__ import annotations

import json
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
from tqdm import tqdm

from evalm.config_toolkit import ConfigError, UserError, to_dict
from evalm.storage import Ranks, RunFolder, read_json, write_atomic
from evalm.train import checkpoint, interrupt
from evalm.train.config import RunConfig
from evalm.train.structure import Packed
from evalm.train.data import LineLoader, LineSource
from evalm.train.loop import Loop, StepRecipe, Stepped, make_optimizer, run_steps, train_step
from evalm.config_toolkit.machine import peak_memory_gib
from evalm.train.metrics import MetricsLogger, flops_per_token, matmul_params, peak_flops
from evalm.train.parallelize import BuildPlan, Runtime, build_model, init_distributed
from evalm.train.schedule import lr_of
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
    """One optimizer step (`loop.Step`): `train_step`, or `RunOptions.step`."""


@dataclass(frozen=True)
class RunOptions:
    """How a run starts besides its config: the command that runs it (`evalm train COMMAND`), `--resume`
    (none, auto or a checkpoint), and for `evalm train uptrain` (train/uptrain.py) the model builder
    `build(config, runtime)`, in place of an `EvalmModel` of `[model]`, and the step (`loop.Step`), in
    place of `train_step`."""

    command: str = "pretrain"
    resume: str = "none"
    build: Callable | None = None
    step: Callable | None = None


def run(config: RunConfig, out: str | Path, make_source: Callable[[Runtime], LineSource],
        options: RunOptions = RunOptions()) -> list[dict[str, Any]]:
    """Train to `config.train.steps`; returns rank 0's log records (empty on other ranks)."""
    runtime = init_distributed(config.train.device)
    folder = RunFolder(out, f"evalm train {options.command}", Ranks(runtime.rank, runtime.world_size,
                                                                   _broadcast if runtime.world_size > 1 else None),
                       inputs=config.inputs())
    logger = MetricsLogger(folder.path, enabled=False, tensorboard=False)
    try:
        with folder.held():  # one owner per run folder: rank 0 holds it for the whole run, for every rank
            logger = MetricsLogger(folder.path, enabled=runtime.is_main, tensorboard=config.train.tensorboard)
            resume_path = _resume_path(folder, options.resume, logger)
            return _train(config, _Place(folder, runtime, logger), make_source, options, resume_path)
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


@dataclass(frozen=True)
class _Place:
    """Where a run runs: its folder (the lock held by rank 0), its process group, its logger."""

    folder: RunFolder
    runtime: Runtime
    logger: MetricsLogger


def _train(config: RunConfig, place: _Place, make_source: Callable[[Runtime], LineSource], options: RunOptions,
           resume_path: Path | None) -> list[dict[str, Any]]:
    folder, runtime, logger = place.folder, place.runtime, place.logger
    tcfg, build = config.train, options.build
    grouped = config.data.structure == "saicl"  # train.structure: one FSDP unit
    if grouped and tcfg.activation_checkpointing:
        raise ConfigError("data.structure='saicl' encodes through caches that the test pass reads inside "
                          "each block; set train.activation_checkpointing=false")
    model = build(config, runtime) if build else build_model(config.model, runtime, BuildPlan(
        tcfg.seed, tcfg.mixed_precision == "bf16", tcfg.activation_checkpointing, not grouped, tcfg.compile))
    optimizer = make_optimizer(model, config.optim)
    source = make_source(runtime)
    loader = LineLoader(source, rank=runtime.rank, world_size=runtime.world_size,
                        batch_size=tcfg.batch_size, shuffle=config.data.shuffle, seed=config.data.seed)
    identity = folder.share(lambda: config.identity(folder.identity))  # rank 0 reads the files
    config_json = {"command": options.command, "world_size": runtime.world_size, **config.to_json(), "identity": identity}
    session = Session(config, folder, runtime, logger, config_json, model, optimizer, loader,
                      options.step or train_step)
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
    """Steps to the end in the one loop (`loop.run_steps`), each followed by `_check_step` and
    `_log_and_save`: log every log_every, save every save_every. Ctrl-C ends the run between steps
    (train.interrupt); a non-finite step stops it before anything is saved."""
    config, runtime, loader = session.config, session.runtime, session.loader
    tcfg, ocfg = config.train, config.optim
    structure = getattr(loader.source, "structure", None) or Packed()  # train.structure: how lines are fed
    tokens_per_step = tcfg.batch_size * tcfg.grad_accum * loader.source.seq_len * runtime.world_size
    meter = _Meter(session, state.step, tokens_per_step)
    bar = tqdm(total=tcfg.steps, initial=state.step, desc=session.config_json["command"], unit="step",
               file=sys.stderr, disable=not runtime.is_main, dynamic_ncols=True)

    def after_step(stepped: Stepped) -> None:
        state.step, state.tokens_seen = stepped.done, state.tokens_seen + tokens_per_step
        _check_step(session, state, stepped)
        bar.update(1)
        bar.set_postfix(loss=f"{stepped.loss:.3f}", refresh=False)
        _log_and_save(session, state, stepped, meter)

    loop = Loop(state.step, tcfg.steps, session.step, StepRecipe(tcfg.grad_accum, ocfg.clip_norm, structure),
                lr_at=lr_of(ocfg, tcfg.steps), after_step=after_step)
    with interrupt.deferred(), bar:  # the bar ends its line before any error is printed
        run_steps(session.model, session.optimizer, loader, runtime, loop)
    return meter.records


def _check_step(session: Session, state: TrainState, stepped: Stepped) -> None:
    """A step not applied (non-finite loss or gradient) is skipped or stops the run (train.nonfinite); an
    applied one that made the weights non-finite stops it."""
    loss, grad_norm = stepped.loss, stepped.grad_norm
    if not stepped.applied:
        _nonfinite(state, loss, grad_norm, session.config.train, session.logger)
    elif not _weights_finite(session.model, session.runtime):
        raise NonFiniteLoss(f"step {state.step}: the update made the weights non-finite (loss before it "
                            f"{loss:.4g}, gradient norm {grad_norm:.4g}; optim.lr={session.config.optim.lr:g} too "
                            f"high?); nothing of this step was saved: the last checkpoint under "
                            f"{session.folder.path}/checkpoints is finite")


def _log_and_save(session: Session, state: TrainState, stepped: Stepped, meter: _Meter) -> None:
    """Log every log_every, save every save_every (and both at the end); stop here on Ctrl-C."""
    config, runtime, model = session.config, session.runtime, session.model
    tcfg, ccfg, loss, grad_norm = config.train, config.checkpoint, stepped.loss, stepped.grad_norm
    if state.step % tcfg.log_every == 0 or state.step == tcfg.steps:
        meter.log(state, loss=loss, lr=stepped.lr, grad_norm=grad_norm)
    if (ccfg.save_every and state.step % ccfg.save_every == 0) or state.step == tcfg.steps:
        loader = session.loader
        snapshot = checkpoint.Snapshot(model, session.optimizer, state.checkpoint_entry(loader.position),
                                       {"data": loader.state_dict(), "rng": checkpoint.rng_state()},
                                       session.config_json)
        checkpoint.save(session.folder.path, state.step, snapshot, ccfg.keep_latest_k)
    if interrupt.stop_requested(runtime.device):
        raise KeyboardInterrupt


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


def _min_over_ranks(t: torch.Tensor) -> None:
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
