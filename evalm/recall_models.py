"""The recall study's models by arch, and how a trained one reads a long sequence (Zoology's protocol at
CPU scale: docs/evaluation.md, "The trained study").

`eva`, `full` and `window` are `EvalmModel`s with 2 attention blocks (MLP 4x) whose attention is the
arch; `mamba` is the state-space twin (evalm/mamba_twin.py) with twice as many blocks and no MLP,
about as many parameters. Width `width`, circular positions of period = the training length. The
trainer (`evalm train recall`) builds a model here and the test cells (`evalm eval recall-cells`)
rebuild it here from the settings the trainer recorded, so both read one definition.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from evalm.config import ModelConfig
from evalm.config_toolkit import InputError
from evalm.model import EvalmModel
from evalm.storage.files import read_json

ARCHS = ("eva", "full", "window", "mamba")
"""The study's models; `mamba` is the twin, the others `ModelConfig.attention`."""
SEGMENT = 2048
"""Tokens a model reads per call on a long sequence (EVALM's cache; the twin's recurrent state)."""
CHECKPOINT, MODEL, SETTINGS, LOG = "checkpoint.pt", "model.json", "settings.json", "log.json"
"""A model folder of `evalm train recall`: its resumable checkpoint (model, optimizer, step, log),
`StudyShape`'s fields, the training settings, and the log written when the steps are done."""


@dataclass(frozen=True)
class StudyShape:
    """A study model: its arch (one of ARCHS), width (d_model), vocabulary, attention blocks, EVA's and
    window-only's block and chunk, the training length (the period of its positions) and its init seed.
    OUT/model.json of `evalm train recall` holds these fields."""

    arch: str
    width: int
    vocab_size: int
    n_layer: int
    window: int
    chunk: int
    seq_len: int
    seed: int
    select_chunks: int = 0  # EVA with selection (docs/eva.md, "Selection"); absent from a model.json before it
    select_only: bool = False


CHUNK = 4
"""The study's chunk c (`evalm train recall --chunk`'s default): a model with another names it."""


def reading_name(shape: StudyShape) -> str:
    """The model's name in the study's cells and tables: its arch; for EVA or window-only with another chunk
    `-cN`; for EVA with selection `-selectK` (`-selectK-only` with select_only). E.g. eva-c2-select2."""
    name = shape.arch + (f"-c{shape.chunk}" if shape.chunk != CHUNK and shape.arch in ("eva", "window") else "")
    if shape.select_chunks:
        name += f"-select{shape.select_chunks}" + ("-only" if shape.select_only else "")
    return name


def study_model(shape: StudyShape, device: str = "cpu") -> torch.nn.Module:
    """The model of `shape` with its initial weights, made on the CPU under its seed and then moved, so
    any device starts from the same weights."""
    torch.manual_seed(shape.seed)
    if shape.arch == "mamba":
        from evalm.mamba_twin import MambaTwin

        return MambaTwin(shape.vocab_size, shape.width, 2 * shape.n_layer).to(device)
    width = shape.width
    config = ModelConfig(vocab_size=shape.vocab_size, d_model=width, n_layer=shape.n_layer, n_head=max(1, width // 32),
                         d_ff=4 * width, window_size=shape.window, chunk_size=shape.chunk, attention=shape.arch,
                         circular_period=shape.seq_len, dropout=0.0, attn_dropout=0.0, init_std=0.02,
                         select_chunks=shape.select_chunks, select_only=shape.select_only)
    model = EvalmModel(config)
    model.init_weights()
    return model.to(device)


def load_trained(folder: str | Path, device: str = "cpu") -> tuple[torch.nn.Module, dict, dict]:
    """A finished model of `evalm train recall` in eval mode, its training settings and its log."""
    folder = Path(folder)
    if not (folder / LOG).is_file():
        raise InputError(f"{folder}: no finished `evalm train recall` model ({LOG} missing); train it first")
    shape, settings, log = (read_json(folder / name) for name in (MODEL, SETTINGS, LOG))
    model = study_model(StudyShape(**shape), device)
    model.load_state_dict(torch.load(folder / CHECKPOINT, weights_only=True, map_location="cpu")["model"])
    return model.eval(), settings, log


def logits_of(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Logits (B, T, V) of a study model from the start: the twin also returns its state."""
    return model(tokens) if isinstance(model, EvalmModel) else model(tokens)[0]


@torch.no_grad()
def predict(model: torch.nn.Module, x: torch.Tensor, labelled: np.ndarray) -> np.ndarray:
    """Greedy predictions at the labelled positions of one sequence x (1, L), read in SEGMENT-token
    segments through the model's own state (EVALM's cache; the twin's recurrent state)."""
    preds, cache, state = [], (model.new_cache() if isinstance(model, EvalmModel) else None), None
    for lo in range(0, x.shape[1], SEGMENT):
        seg = x[:, lo : lo + SEGMENT]
        if cache is not None:
            logits = model(seg, cache=cache)
        else:
            logits, state = model(seg, state)
        want = labelled[(labelled >= lo) & (labelled < lo + seg.shape[1])] - lo
        preds.append(logits[0, want].argmax(-1).cpu().numpy())
    return np.concatenate(preds)
