"""`evalm train recall`: one model of the recall study (Zoology's protocol at CPU scale) trained from
scratch on MQAR and passkey batches, through the trainer's step (`train.local`), resumable.

    evalm train recall --arch eva --width 64 --out runs/recall/models/eva-64
    evalm train recall --arch mamba --width 64 --out runs/recall/models/mamba-64     # needs 'evalm[hf]'

The whole grid is the study file `configs/study-recall.toml` (`evalm run --config configs/study-recall.toml`);
its tests are `evalm eval recall-cells` (icl_eval/recall/study_cells.py).

Every model of a width has the same data (one stream seeded by (seed, width): identical batches),
steps, optimiser and schedule: `--mqar-share` of each batch is MQAR with `kv` drawn per sequence from
`--train-kv`, the rest the passkey copy (text/recall_data.py). The step is `train.loop.train_step`
(token-mean cross-entropy, clip at 1.0, the update), as in pretraining. What is the study's own is
its recipe, kept from the runs docs/results.md quotes: AdamW (betas 0.9, 0.98) decaying *every*
parameter by 0.1 (the main job's `weight_decay_groups` spares biases and norms), and a linear
warm-up over steps / 20 then cosine decay to 10% (`lr_at`).

Resumable: OUT/checkpoint.pt every `--checkpoint-every` steps (model, optimizer, step, log; loaded
with weights_only=True); the data stream is a pure function of (seed, width, step), so a resumed
run replays the batches it had drawn. When the steps are done, OUT/log.json (parameters, seconds
per step, the last losses, the machine) says so and a rerun does nothing. The settings are
OUT/settings.json; a rerun with other ones is refused (--device and --threads aside: the data and
initial weights are the same on any device, and each model records the machine its steps ran on).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from evalm.config_toolkit import ConfigError, Parser
from evalm.config_toolkit.device import check_threads, device_flag
from evalm.config_toolkit.machine import device_name, torch_threads
from evalm.recall_models import ARCHS, CHECKPOINT, CHUNK, LOG, MODEL, SETTINGS, StudyShape, logits_of, reading_name, study_model
from evalm.storage import RunFolder
from evalm.storage.files import read_json, write_json
from evalm.text.recall_data import FAR_PAIRS, PASSKEY_LENGTH, Vocab, training_batch
from evalm.train.local import train_in_process
from evalm.train.loop import Loop, StepRecipe, Stepped, train_step

COMMAND = "evalm train recall"
UNRECORDED = ("device", "threads")
"""Not how a model is trained (the same data and initial weights on any device): free on a rerun."""


@dataclass(frozen=True)
class RecallTraining:
    """One model of the study: its arch and width, the data, the steps (the flags of `evalm train recall`)."""

    arch: str
    width: int
    n_layer: int = 2
    seq_len: int = 64
    window: int = 16
    chunk: int = CHUNK
    select_chunks: int = 0
    select_only: bool = False
    vocab: int = 128
    mqar_share: float = 0.75
    train_kv: tuple[int, ...] = (4, 8, 16)
    steps: int = 2500
    batch_size: int = 32
    lr: float = 3e-3
    checkpoint_every: int = 100
    seed: int = 0
    threads: int = 1
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ConfigError(f"--arch {self.arch!r}: one of {', '.join(ARCHS)}")
        for flag in ("width", "n_layer", "window", "chunk", "steps", "batch_size", "checkpoint_every"):
            _at_least(flag, getattr(self, flag), 1)
        check_threads(self.threads)
        if min(self.train_kv) < 1:
            raise ConfigError(f"--train-kv {','.join(map(str, self.train_kv))}: every number of pairs must be >= 1")
        shortest = max(4 * max(self.train_kv), PASSKEY_LENGTH)
        if self.seq_len < shortest:
            raise ConfigError(f"--seq-len {self.seq_len}: at least {shortest} (MQAR's --train-kv {max(self.train_kv)} "
                              f"pairs need --seq-len / 4 of them, Zoology's constraint, and a passkey copy "
                              f"{PASSKEY_LENGTH} tokens)")
        keys = max(*self.train_kv, FAR_PAIRS)
        if self.vocab < 2 * (keys + 1):
            raise ConfigError(f"--vocab {self.vocab}: at least {2 * (keys + 1)}: each half (keys, values) holds "
                              f"{keys} distinct tokens (the largest --train-kv, and the {FAR_PAIRS} pairs of the "
                              "far-MQAR test) besides token 0")
        if self.arch != "mamba" and self.window % self.chunk:
            raise ConfigError(f"--window {self.window}: a multiple of --chunk {self.chunk} (EVA's chunks never cross "
                              "a block)")
        heads = max(1, self.width // 32)
        if self.arch != "mamba" and self.width % heads:
            raise ConfigError(f"--width {self.width}: the model has width // 32 = {heads} heads, which must divide "
                              f"it; e.g. --width {self.width - self.width % heads}")
        if self.select_chunks and self.arch != "eva":
            raise ConfigError(f"--select-chunks {self.select_chunks}: selection reads EVA's summaries; --arch eva only")
        if self.select_chunks < 0 or self.select_chunks > self.seq_len // self.chunk:
            raise ConfigError(f"--select-chunks {self.select_chunks}: from 0 (none) to the chunks of a training "
                              f"sequence, --seq-len / --chunk = {self.seq_len // self.chunk}")
        if self.select_only and not self.select_chunks:
            raise ConfigError("--select-only without --select-chunks: nothing is selected; give --select-chunks K")
        if not 0 <= self.mqar_share <= 1:
            raise ConfigError(f"--mqar-share {self.mqar_share}: a share of the batch, from 0 to 1")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"--lr {self.lr}: a learning rate is a finite number > 0, e.g. 3e-3")
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"--seed {self.seed}: from 0 to 2**63 - 1")

    def check_memory(self) -> None:
        """Refuse, before the model is built or its folder made, a shape or batch this machine cannot train
        (evalm.footprint's lower bound: the parameters four times, the logits and their gradient, one
        activation per block, the batch's arrays): `--n-layer 1e9` or `--batch-size 1e9` grew without a line,
        `--width`, `--seq-len`, `--vocab` or `--window 1e9` ended in the allocator's error."""
        from evalm.footprint import check_fits, parameters, training_bytes

        vocab, tokens = Vocab(self.vocab).size, self.batch_size * self.seq_len
        n = parameters(vocab, self.width, self.n_layer, 4 * self.width) + self.seq_len * self.width  # + positions
        read = self.batch_size * max(self.seq_len, self.window if self.arch in ("eva", "window") else 0)
        need = training_bytes(n, vocab, tokens) + 4 * self.n_layer * read * self.width + 4 * 8 * tokens
        window = f" --window {self.window}" if self.arch in ("eva", "window") else ""
        check_fits(need, f"--arch {self.arch} --width {self.width} --n-layer {self.n_layer} --vocab {self.vocab}{window} "
                   f"(about {n:.3g} parameters) on batches of --batch-size {self.batch_size} x --seq-len "
                   f"{self.seq_len}", self.device)

    def shape(self) -> dict:
        """`StudyShape`'s fields (OUT/model.json: the test cells rebuild the model from it)."""
        selection = {"select_chunks": self.select_chunks, "select_only": self.select_only} if self.select_chunks else {}
        return {"arch": self.arch, "width": self.width, "vocab_size": Vocab(self.vocab).size, "n_layer": self.n_layer,
                "window": self.window, "chunk": self.chunk, "seq_len": self.seq_len, "seed": self.seed, **selection}


def _at_least(flag: str, value: int, low: int) -> None:
    if value < low:
        raise ConfigError(f"--{flag.replace('_', '-')} {value}: must be >= {low}")


def lr_at(step: int, lr: float, steps: int) -> float:
    """Linear warm-up over steps / 20, then cosine decay to 10% (a pure function of the step)."""
    warm = max(1, steps // 20)
    if step < warm:
        return lr * (step + 1) / warm
    return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm))))


class RecallBatches:
    """The training stream of one width: `training_batch` after `training_batch` from one seeded
    generator (the trainer's `next_batch`)."""

    def __init__(self, run: RecallTraining):
        self.run, self.vocab = run, Vocab(run.vocab)
        self.rng = np.random.default_rng([run.seed, run.width])

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = training_batch(self.rng, batch_size=self.run.batch_size, seq_len=self.run.seq_len,
                              train_kv=self.run.train_kv, mqar_share=self.run.mqar_share, vocab=self.vocab)
        return torch.from_numpy(x), torch.from_numpy(y)


class StudyLogits:
    """How the trainer's step reads a study model (train.structure's interface): lines as they are,
    the logits without the twin's state."""

    def prepare(self, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return inputs, targets

    def logits(self, model, inputs: torch.Tensor, device) -> torch.Tensor:
        return logits_of(model, inputs.to(device))


def optimizer_of(model: torch.nn.Module, lr: float) -> torch.optim.AdamW:
    """The study's AdamW: every parameter decayed (module docstring)."""
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.98))


def train_model(run: RecallTraining, out: str | Path) -> dict:
    """Train (or resume, or find done) the model of `run` in `out`; its log."""
    run.check_memory()  # before the folder is made
    folder = RunFolder(out, COMMAND)
    with folder.held():
        folder.record(SETTINGS, asdict(run), ignore=UNRECORDED, added=("select_chunks", "select_only"),
                      what="holds a model trained with other settings",
                      advice=lambda keys: "use another --out, or the same flags")
        if (folder.path / LOG).is_file():
            return read_json(folder.path / LOG)
        folder.write_json(MODEL, run.shape())
        with torch_threads(run.threads):
            return _train(run, folder.path)


def _train(run: RecallTraining, out: Path) -> dict:
    path, name = out / CHECKPOINT, f"{reading_name(StudyShape(**run.shape()))}-{run.width}"
    model = study_model(StudyShape(**run.shape()), run.device)
    optimizer = optimizer_of(model, run.lr)
    state = (torch.load(path, weights_only=True, map_location="cpu") if path.is_file()
             else {"step": 0, "log": {"seconds": 0.0, "loss": []}})
    if "model" in state:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["opt"])
    log, batches = state["log"], RecallBatches(run)
    for _ in range(state["step"]):  # the stream is a pure function of (seed, width, step)
        batches.next_batch()
    if state["step"] < run.steps:  # where the steps ran (a run resumed elsewhere names both machines)
        here = device_name(run.device)
        log["device"] = here if log.get("device", here) == here else f"{log['device']}, then {here}"
    t0 = time.perf_counter() - log["seconds"]

    def after_step(stepped: Stepped) -> None:
        done = stepped.done
        log["loss"] = (log["loss"] + [round(stepped.loss, 4)])[-50:]
        if done % run.checkpoint_every == 0 or done == run.steps:
            log["seconds"] = time.perf_counter() - t0
            _save(path, {"step": done, "model": model.state_dict(), "opt": optimizer.state_dict(), "log": log})
            print(f"{name} step {done}/{run.steps} loss {np.mean(log['loss'][-10:]):.3f} "
                  f"({log['seconds'] / done:.2f} s/step)", flush=True)

    loop = Loop(state["step"], run.steps, train_step, StepRecipe(clip_norm=1.0, structure=StudyLogits()),
                lr_at=functools.partial(lr_at, lr=run.lr, steps=run.steps), after_step=after_step)
    train_in_process(model, batches, optimizer, loop)
    log = {**log, "params": sum(p.numel() for p in model.parameters()), "steps": run.steps,
           "seconds_per_step": log["seconds"] / run.steps}
    write_json(out / LOG, log)
    return log


def _save(path: Path, state: dict) -> None:
    """The checkpoint whole or not at all: written beside, then renamed over the last one."""
    partial = path.with_name(path.name + ".partial")
    torch.save(state, partial)
    partial.replace(path)


def parser() -> Parser:
    p = Parser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", required=True, help=f"one of {', '.join(ARCHS)} (required)")
    p.add_argument("--width", type=int, required=True, help="d_model, the residual width (required)")
    p.add_argument("--out", required=True, help="the model's folder (checkpoint, settings, log) (required)")
    p.add_argument("--n-layer", type=int, default=2, help="attention blocks; Mamba gets twice as many (default: 2)")
    p.add_argument("--seq-len", type=int, default=64, help="training length (default: 64)")
    p.add_argument("--window", type=int, default=16, help="EVA's and window-only's block w (default: 16)")
    p.add_argument("--chunk", type=int, default=4, help="EVA's chunk c (default: 4)")
    p.add_argument("--select-chunks", type=int, default=0, metavar="K",
                   help="EVA with selection: each query also reads the tokens of the K chunks its summaries score "
                        "highest (docs/eva.md, \"Selection\"; default: 0, EVA as published)")
    p.add_argument("--select-only", action="store_true",
                   help="with --select-chunks: the summaries only choose; none enters the softmax (default: off)")
    p.add_argument("--vocab", type=int, default=128,
                   help="keys and values, half each (Zoology's vocab_size; default: 128)")
    p.add_argument("--mqar-share", type=float, default=0.75, help="share of each batch that is MQAR (default: 0.75)")
    p.add_argument("--train-kv", type=_ints, default=(4, 8, 16), help="MQAR pairs in training (default: 4,8,16)")
    p.add_argument("--steps", type=int, default=2500, help="optimizer steps (default: 2500)")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per step (default: 32)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default: 3e-3)")
    p.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints (default: 100)")
    p.add_argument("--seed", type=int, default=0, help="model init and data seed (default: 0)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    p.add_argument("--device", default="cpu", type=device_flag, help="torch device, e.g. cuda; recorded in the log, not a setting "
                   "(default: cpu)")
    return p


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ValueError(f"{text!r}: integers separated by commas") from None


def main(argv: Sequence[str] | None = None) -> int:
    args = vars(parser().parse_args(argv))
    out = args.pop("out")
    log = train_model(RecallTraining(**args), out)
    print(f"{out}: {args['arch']}-{args['width']} trained, {log['steps']} steps, {log['params']:,} parameters, "
          f"{log['seconds_per_step']:.2f} s/step on {log['device']}")
    return 0
