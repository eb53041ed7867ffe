"""Model files: `model.safetensors` + `config.json` (the exported, framework-neutral form).

Training checkpoints are DCP folders (train/checkpoint.py); `evalm export` turns one into this
form. Loading never unpickles: safetensors holds only tensors, the config is JSON validated into
`ModelConfig`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_model as _load_weights
from safetensors.torch import save_model as _save_weights

from evalm.config_toolkit import build, to_dict
from evalm.config import ModelConfig
from evalm.model import EvalmModel

WEIGHTS, CONFIG = "model.safetensors", "config.json"


def save_model(model: EvalmModel, folder: str | Path) -> Path:
    """Write weights (tied tensors stored once) and the model config; returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _save_weights(model, str(folder / WEIGHTS))
    (folder / CONFIG).write_text(json.dumps({"model": to_dict(model.config)}, indent=2) + "\n")
    return folder


def load_config(folder: str | Path) -> ModelConfig:
    path = Path(folder) / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no config.json (is {folder} an exported model? see `evalm export --help`)")
    data = json.loads(path.read_text())
    return build(ModelConfig, data.get("model", data), where=f"{path} [model]")


def load_model(folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> EvalmModel:
    """Build the model from config.json and load its safetensors strictly; returns it in eval mode."""
    folder = Path(folder)
    config = load_config(folder)
    weights = folder / WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(f"{weights}: weights missing")
    with torch.device("meta"):
        model = EvalmModel(config)
    model.to_empty(device=device)
    model.tie_weights()
    _load_weights(model, str(weights), strict=True, device=str(device))
    if dtype is not None:
        model.to(dtype)
    return model.eval()
