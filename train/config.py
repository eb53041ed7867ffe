"""Training configs: one frozen dataclass per TOML section.

A run's TOML file holds `[model]`, `[data]`, `[optim]`, `[train]` and `[checkpoint]`; each
component receives only its own section, validated by `config_toolkit.build` (unknown keys name the
file, the key and the valid keys). Defaults are the paper's Table 6 where it speaks, else the
metaseq/OPT recipe it started from (docs/training.md), marked as such.
"""

from __future__ import annotations

import os
from dataclasses import dataclass as _std_dataclass
from dataclasses import field
from pathlib import Path
from typing import Any, Literal

from pydantic.dataclasses import dataclass

from evalm.config_toolkit import (FROZEN, ConfigError, apply_overrides, build, check_overrides, check_sections, read_toml,
                                  to_dict)
from evalm.config import ModelConfig
from evalm.train.instructions import MSIT_COLUMNS


@dataclass(config=FROZEN, frozen=True)
class DataConfig:
    """Pretraining data: token shards written by `evalm train tokenizer`."""

    shards: str = "out/tokens"
    """Folder holding `manifest.json` and the token shards."""
    seq_len: int = 8192
    """Tokens per line; each line reads seq_len + 1 tokens (inputs and shifted targets). EVALM §3.2: 8192."""
    shuffle: bool = True
    """Visit the lines of each epoch in a seeded random order (else in file order)."""
    seed: int = 1234
    """Seed of the line order; the order is a pure function of (seed, epoch), so resume is exact."""

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise ConfigError(f"seq_len must be >= 1, got {self.seq_len}")

    @property
    def structure(self) -> Literal["packed"]:
        """Pretraining lines are always fed packed (the tuning data's `structure` has a choice)."""
        return "packed"


@dataclass(config=FROZEN, frozen=True)
class MsitDataConfig:
    """Many-shot instruction tuning data (EVALM §3.2, Appendix B; docs/training.md)."""

    train_file: str = "train/samples/msit-sample.jsonl"
    """Instruction examples, read through `datasets` offline and streamed: a jsonl/json/csv/parquet file,
    a `save_to_disk` folder, or a cached dataset id `id[/config][:split]` (e.g. `Muennighoff/flan:train`)."""
    columns: dict[str, str] = field(default_factory=lambda: dict(MSIT_COLUMNS))
    """Example field -> data column: `task`, `input`, `output` (FLAN collections: `task_name`, `inputs`, `targets`)."""
    tokenizer: str = "bytes"
    """`tokenizer.json`, its folder, a SentencePiece `.model`, or "bytes" (no file)."""
    templates: dict[str, list[str]] = field(default_factory=dict)
    """Per task: [prompt, answer] with `{input}` / `{output}` slots; tasks not listed use `default_template`."""
    default_template: list[str] = field(default_factory=lambda: ["{input}\n", "{output}"])
    """[prompt, answer] used for tasks without their own template."""
    seq_len: int = 8192
    """Tokens per line: 8192 for MSIT, 16384 (2 x 8192) for MSIT+ (EVALM §3.2)."""
    allow_split: bool = False
    """Let examples straddle lines (metaseq `none`); default packs whole examples (`complete`)."""
    oversize: Literal["drop", "truncate"] = "drop"
    """An example longer than a line: dropped (counted in the log) or right-truncated (metaseq)."""
    group_by_task: bool = True
    """Fill each line with examples of one task, which is what makes a line many-shot (docs/training.md)."""
    loss_on: Literal["answer", "all"] = "answer"
    """Loss on answer tokens and their end-of-example token only (metaseq src/tgt), or on every token."""
    clusters: dict[str, list[str]] = field(default_factory=dict)
    """FLAN-style clusters: cluster name -> its tasks (EVALM Appendix B)."""
    held_out_clusters: list[str] = field(default_factory=list)
    """Clusters whose tasks never appear in tuning data (they are evaluation clusters)."""
    held_out_tasks: list[str] = field(default_factory=list)
    """Single tasks held out (EVALM Appendix B holds out AGNews itself, not its cluster)."""
    pretrain_shards: str = ""
    """Token-shard folder of pretraining; with `pretrain_fraction` > 0 its lines are mixed in."""
    pretrain_fraction: float = 0.0
    """Share of tuning lines that are plain pretraining lines (loss on every token), spread evenly,
    so tuning does not wreck language modelling (train.packing.MixedLines); 0 turns it off."""
    structure: Literal["packed", "saicl"] = "packed"
    """How a line is fed (train.structure): `packed`, examples back to back (EVALM §3.2), or
    `saicl`, each example its own group and the last `saicl_queries` examples tested over their merge
    (the SAICL decoder mask; needs examples of one token length, e.g. the synthetic family)."""
    saicl_queries: int = 8
    """With structure `saicl`: test examples per line; the rest of the line's examples are its demonstrations."""
    shuffle: bool = True
    """Shuffle examples within each task (seeded) before packing, and lines across epochs."""
    seed: int = 1234
    """Seed of example and line order."""

    def __post_init__(self) -> None:
        if self.structure == "saicl" and (self.pretrain_fraction or self.saicl_queries < 1):
            raise ConfigError("structure 'saicl' needs saicl_queries >= 1 and pretrain_fraction = 0 (pretraining lines "
                              "hold no examples to split into demonstrations and tests)")
        if self.seq_len < 2:
            raise ConfigError(f"seq_len must be >= 2, got {self.seq_len}")
        for name in ("default_template", *self.templates):
            pair = self.default_template if name == "default_template" else self.templates[name]
            if len(pair) != 2 or "{output}" not in pair[1]:
                raise ConfigError(f"template {name!r} must be [prompt, answer] with {{output}} in the answer")
        if not 0.0 <= self.pretrain_fraction < 1.0 or (self.pretrain_fraction and not self.pretrain_shards):
            raise ConfigError("pretrain_fraction must lie in [0, 1) and needs pretrain_shards (a token-shard folder)")
        if set(self.columns) != set(MSIT_COLUMNS):
            raise ConfigError(f"columns must map exactly {sorted(MSIT_COLUMNS)} to data columns, got {self.columns}")
        unknown = sorted(set(self.held_out_clusters) - set(self.clusters))
        if unknown:
            raise ConfigError(f"held_out_clusters {unknown} are not in clusters {sorted(self.clusters)}")


@dataclass(config=FROZEN, frozen=True)
class OptimConfig:
    """AdamW with warm-up and polynomial decay (EVALM Table 6; metaseq `adam` is AdamW)."""

    lr: float = 8e-5
    """Peak learning rate (Table 6)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """Adam betas (OPT recipe [metaseq default])."""
    eps: float = 1e-8
    """Adam epsilon (OPT recipe)."""
    weight_decay: float = 0.1
    """Decoupled weight decay on matrices and embeddings, not on biases or norms (Table 6: 0.1)."""
    clip_norm: float = 1.0
    """Global L2 gradient-norm clip (Table 6: 1.0, L2); 0 disables."""
    warmup_steps: int = 715
    """Linear warm-up steps (OPT: 375M tokens, about 715 steps of 0.5M tokens)."""
    decay_power: float = 1.0
    """Exponent of the polynomial decay after warm-up (1.0 = linear, fairseq's default)."""
    min_lr_ratio: float = 0.1
    """LR at the last step as a fraction of `lr` (OPT decays to 0.1 x LR)."""

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.warmup_steps < 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError("need lr > 0, warmup_steps >= 0 and 0 <= min_lr_ratio <= 1")
        if self.clip_norm < 0 or self.eps <= 0 or self.weight_decay < 0:
            raise ConfigError("need clip_norm >= 0 (0 disables), eps > 0 and weight_decay >= 0")


@dataclass(config=FROZEN, frozen=True)
class TrainConfig:
    """The loop: how long, how big, where, and how often to report."""

    steps: int = 100
    """Optimizer steps in the whole run (the LR schedule ends here)."""
    batch_size: int = 1
    """Lines per rank per micro-step; the global batch is batch_size x grad_accum x world size."""
    grad_accum: int = 1
    """Micro-steps per optimizer step."""
    seed: int = 0
    """Seed of the weight init (same on every rank) and, plus the rank, of dropout."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """`auto` uses CUDA with NCCL when available, else CPU with gloo."""
    mixed_precision: Literal["fp32", "bf16"] = "fp32"
    """bf16 compute with fp32 parameters and gradient reduction (FSDP2 MixedPrecisionPolicy)."""
    activation_checkpointing: bool = False
    """Recompute each block in the backward pass: memory for 8k lines at the cost of ~1/3 more compute."""
    compile: bool = False
    """`torch.compile` each decoder block (after activation checkpointing, before FSDP, as torchtitan does):
    the norms', MLP's and residuals' element-wise work fused into the matmuls' neighbours. EVA's attention is
    compiled on its own on a GPU either way (evalm/flex.py). Off by default: the first steps of each shape
    compile for a minute, and the CPU routes (fused kernels, autograd Functions) gain little."""
    log_every: int = 1
    """Optimizer steps between log lines and metrics.jsonl records."""
    tensorboard: bool = False
    """Also write TensorBoard events under OUT/tensorboard (needs `pip install 'evalm[tensorboard]'`)."""
    nonfinite: Literal["stop", "skip"] = "stop"
    """A step whose loss or gradient is non-finite: `stop` the run (nothing of it is applied or saved), or
    `skip` the batch without an update, at most `max_nonfinite_skips` times (counted in the metrics)."""
    max_nonfinite_skips: int = 10
    """With nonfinite=skip: skipped batches allowed in the whole run before it stops all the same."""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "grad_accum", "log_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_nonfinite_skips < 0:
            raise ConfigError(f"max_nonfinite_skips must be >= 0, got {self.max_nonfinite_skips}")


@dataclass(config=FROZEN, frozen=True)
class CheckpointConfig:
    """DCP checkpoints under OUT/checkpoints/step-XXXXXXXX/."""

    save_every: int = 1000
    """Optimizer steps between checkpoints; one is also written at the last step. 0: only at the end."""
    keep_latest_k: int = 3
    """Complete checkpoints kept; older ones are deleted after a new one is complete. 0 keeps all."""
    init_from: str = ""
    """A checkpoint (step folder or run folder) whose model weights start the run (MSIT); "" for none."""

    def __post_init__(self) -> None:
        if self.save_every < 0 or self.keep_latest_k < 0:
            raise ConfigError("save_every and keep_latest_k must be >= 0")


@_std_dataclass(frozen=True)
class RunConfig:
    """The sections of one run file, each validated on its own."""

    model: ModelConfig
    data: DataConfig | MsitDataConfig
    optim: OptimConfig
    train: TrainConfig
    checkpoint: CheckpointConfig

    def to_json(self) -> dict[str, Any]:
        return {name: to_dict(getattr(self, name)) for name in ("model", "data", "optim", "train", "checkpoint")}

    def inputs(self) -> list[str]:
        """The files and folders the run reads (token shards, tokenizer, instruction file, the checkpoint it
        starts from): the run folder may be none of them, nor lie inside one (storage.RunFolder)."""
        values = [v for v in to_dict(self.data).values() if isinstance(v, str)]
        return [v for v in (*values, self.checkpoint.init_from) if v]

    def identity(self, digest) -> dict[str, str]:
        """What a resumed run must share with the checkpoint's run besides the architecture (train.identity);
        `digest` is the run folder's cached one (`RunFolder.identity`)."""
        from evalm.train.identity import run_identity

        return run_identity(to_dict(self.data), digest)

    def check_memory(self) -> None:
        """Refuse, before anything is built or written, a model and micro-batch that cannot fit in this machine's
        memory (evalm.footprint): `--set model.n_layer=1e9` or `train.batch_size=1e9` once grew without a line of
        output. Checked when a run starts (`train.command`), not when a config is read: a 1.3B run file is
        valid on a machine too small to train it."""
        from evalm.config_toolkit.device import check_device
        from evalm.footprint import check_fits, parameters, training_bytes

        m, t = self.model, self.train
        if t.device == "cuda":  # a CPU build of torch ended in NCCL's error, reported as a bug
            check_device("cuda", "[train] device")
        n = parameters(m.vocab_size, m.d_model, m.n_layer, m.d_ff)
        need = training_bytes(n, m.vocab_size, t.batch_size * self.data.seq_len, int(os.environ.get("WORLD_SIZE", "1")))
        device = "cuda" if t.device == "cuda" or (t.device == "auto" and _cuda()) else "cpu"
        check_fits(need, f"[model] and [train]: a model of about {n:.3g} parameters trained on micro-batches of "
                   f"train.batch_size={t.batch_size} x data.seq_len={self.data.seq_len} tokens", device)


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


SECTIONS = ("model", "data", "optim", "train", "checkpoint")


def load_run_config(path: str | Path, overrides: list[str], data_cls: type = DataConfig) -> RunConfig:
    """Read a run file, apply `section.key=value` overrides, validate each section."""
    classes = {"model": ModelConfig, "data": data_cls, "optim": OptimConfig, "train": TrainConfig,
               "checkpoint": CheckpointConfig}
    check_overrides(overrides, classes)  # a misspelled override is the flag's mistake, not the file's
    raw = apply_overrides(read_toml(path), overrides)
    check_sections(raw, SECTIONS, str(path))
    built = {name: build(cls, raw.get(name), where=f"{path} [{name}]") for name, cls in classes.items()}
    return RunConfig(**built)
