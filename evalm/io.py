"""Model files: `model.safetensors` + `config.json` (the exported, framework-neutral form).

Training checkpoints are DCP folders (train/checkpoint.py); `evalm export` turns one into this
form. Loading never unpickles: safetensors holds only tensors, the config is JSON validated into
`ModelConfig`.

The two files must describe one model. Shapes catch most edits of config.json, but not all:
`window_size`, `chunk_size` or `circular_period` change the computation and no tensor's shape, so
an edited value would evaluate a different model without an error. The weights file therefore
carries the config it was saved with in its safetensors metadata (`evalm.model`), and loading
compares every architecture field and every tensor's shape, naming what differs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_model as _load_weights
from safetensors.torch import save_model as _save_weights

from evalm.config_toolkit import MissingInput, build, to_dict
from evalm.config import ModelConfig, architecture_differences
from evalm.model import EvalmModel
from evalm.storage import DamagedFile, read_json

WEIGHTS, CONFIG = "model.safetensors", "config.json"
META_KEY = "evalm.model"


def save_model(model: EvalmModel, folder: str | Path) -> Path:
    """Write weights (tied tensors stored once, the config in their metadata) and config.json."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = to_dict(model.config)
    metadata = {META_KEY: json.dumps(config, sort_keys=True), "format": "pt"}  # "format": transformers reads it too
    _save_weights(model, str(folder / WEIGHTS), metadata=metadata)
    (folder / CONFIG).write_text(json.dumps({"model": config}, indent=2) + "\n")
    return folder


def load_config(folder: str | Path) -> ModelConfig:
    path = Path(folder) / CONFIG
    if not path.is_file():
        raise MissingInput(f"{path}: no config.json (is {folder} an exported model? see `evalm export --help`)")
    data = read_json(path)
    if "evalm" in data and "model" not in data:  # a transformers folder of `evalm export --hf`
        return build(ModelConfig, data["evalm"], where=f"{path} [evalm]")
    return build(ModelConfig, data.get("model", data), where=f"{path} [model]")


def check_weights(folder: Path, config: ModelConfig, model: EvalmModel) -> None:
    """Refuse weights that are damaged or that config.json does not describe, naming what differs."""
    weights = folder / WEIGHTS
    try:
        with safe_open(str(weights), framework="pt") as f:
            saved = json.loads((f.metadata() or {}).get(META_KEY, "null"))
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as err:
        raise DamagedFile(f"{weights}: damaged or truncated safetensors file ({err}); export the model again "
                          "(`evalm export`)") from None
    if saved is not None:
        fields = [f"{k}: weights {old!r}, config.json {new!r}"
                  for k, old, new in architecture_differences(saved, to_dict(config))]
        if fields:
            raise DamagedFile(f"{folder / CONFIG} does not describe {weights} ({'; '.join(fields)}); restore "
                              "config.json as exported, or export again")
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    wrong = [f"{k}: weights {shapes[k]}, config {want[k]}" for k in want if k in shapes and shapes[k] != want[k]]
    if wrong:
        raise DamagedFile(f"{folder / CONFIG} does not match the shapes in {weights}: {'; '.join(wrong[:5])}"
                          f"{f' (+{len(wrong) - 5} more)' if len(wrong) > 5 else ''}; restore config.json as exported")


def load_model(folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> EvalmModel:
    """Build the model from config.json, check it against the weights, load them strictly; eval mode."""
    folder = Path(folder)
    config = load_config(folder)
    weights = folder / WEIGHTS
    if not weights.is_file():
        raise MissingInput(f"{weights}: weights missing")
    with torch.device("meta"):
        model = EvalmModel(config)
    check_weights(folder, config, model)
    model.to_empty(device=device)
    model.tie_weights()
    try:
        _load_weights(model, str(weights), strict=True, device=str(device))
    except RuntimeError as err:  # missing or unexpected tensor names
        raise DamagedFile(f"{weights} does not hold the tensors of the model {folder / CONFIG} describes: "
                          f"{str(err).splitlines()[0]}") from None
    if dtype is not None:
        model.to(dtype)
    return model.eval()
