"""Model files: `model.safetensors` + `config.json` (the exported, framework-neutral form).

Training checkpoints are DCP folders (train/checkpoint.py); `evalm export` turns one into this
form. Loading never unpickles: safetensors holds only tensors, the config is JSON validated into
`ModelConfig`.

The two files must describe one model. Shapes catch most edits of config.json, but not all:
`window_size`, `chunk_size` or `circular_period` change the computation and no tensor's shape, so
an edited value would evaluate a different model without an error. The weights file therefore
carries the config it was saved with in its safetensors metadata (`evalm.model`; weights without
it are refused, as nothing could then be checked), and loading compares every architecture field,
the number of blocks and every tensor's shape and dtype, naming what differs. The header is read
first and the model is built only once it matches: config.json's sizes are not trusted to allocate
(`n_layer = 1000000000` would build 10^9 modules before any check).
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_model as _load_weights
from safetensors.torch import save_model as _save_weights

from evalm.config_toolkit import MissingInput, build, to_dict
from evalm.config import ModelConfig, architecture_differences
from evalm.model import EvalmModel
from evalm.hf_weights import header_of
from evalm.storage import DamagedFile, read_json, replaced, write_atomic

WEIGHTS, CONFIG = "model.safetensors", "config.json"
META_KEY = "evalm.model"


def save_model(model: EvalmModel, folder: str | Path) -> Path:
    """Write weights (tied tensors stored once, the config in their metadata) and config.json."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = to_dict(model.config)
    metadata = {META_KEY: json.dumps(config, sort_keys=True), "format": "pt"}  # "format": transformers reads it too
    with replaced(folder / WEIGHTS) as tmp:  # whole or not at all, never through a link
        _save_weights(model, str(tmp), metadata=metadata)
        _sort_metadata(tmp)
    write_atomic(folder / CONFIG, json.dumps({"model": config}, indent=2) + "\n")
    return folder


def _sort_metadata(path: Path) -> None:
    """safetensors writes the metadata in hash-map order, so the same weights gave files of different
    bytes, and a different SHA-256 identity for every resume key built on them (icl_eval.protocol.units).
    The keys are sorted in place: a permutation of the same compact JSON, so the same length and offsets."""
    with path.open("r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        if "__metadata__" not in header:
            return
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) <= n:  # always (the same keys and values); otherwise the file is left as written
            f.seek(8)
            f.write(text + b" " * (n - len(text)))


def load_config(folder: str | Path) -> ModelConfig:
    path = Path(folder) / CONFIG
    if not path.is_file():
        raise MissingInput(f"{path}: no config.json (is {folder} an exported model? see `evalm export --help`)")
    data = read_json(path)
    if "evalm" in data and "model" not in data:  # a transformers folder of `evalm export --hf`
        return build(ModelConfig, data["evalm"], where=f"{path} [evalm]")
    return build(ModelConfig, data.get("model", data), where=f"{path} [model]")


FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
"""Safetensors dtypes a model's weights may have (one of them for every tensor)."""


@dataclass(frozen=True)
class Header:
    """What a safetensors header says, read without reading a tensor (a few KB at the file's start)."""

    saved: dict | None
    """The config the weights were saved with (`evalm.model` metadata), None when absent."""
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]


def read_header(weights: Path) -> Header:
    """The header of `weights` (evalm.hf_weights.header_of), or DamagedFile naming it."""
    remedy = "export the model again (`evalm export`)"
    meta, shapes, dtypes = header_of(weights, remedy)
    try:
        saved = json.loads(meta[META_KEY]) if META_KEY in meta else None
    except ValueError as err:
        raise DamagedFile(f"{weights}: damaged or truncated safetensors file ({str(err)[:200]}); {remedy}") from None
    return Header(saved, shapes, dtypes)


def check_header(folder: Path, config: ModelConfig, header: Header) -> None:
    """Refuse, before any model is built, weights that config.json does not describe: every architecture
    field against the config saved in the weights, the number of blocks against the tensors themselves
    (so an edited `n_layer = 1000000000` is refused instead of building 10^9 modules), one floating dtype."""
    weights, config_json = folder / WEIGHTS, folder / CONFIG
    if not isinstance(header.saved, dict):
        raise DamagedFile(f"{weights} does not record the model it holds (no {META_KEY!r} metadata: not written by "
                          f"`evalm export`), so {config_json} cannot be checked against it; export the model again")
    fields = [f"{k}: weights {old!r}, config.json {new!r}"
              for k, old, new in architecture_differences(header.saved, to_dict(config))]
    if fields:
        raise DamagedFile(f"{config_json} does not describe {weights} ({'; '.join(fields)}); restore "
                          "config.json as exported, or export again")
    blocks = {name.split(".")[1] for name in header.shapes if name.startswith("blocks.")}
    if len(blocks) != config.n_layer:
        raise DamagedFile(f"{config_json} does not match the shapes in {weights}: n_layer {config.n_layer}, the "
                          f"weights hold {len(blocks)} block(s); restore config.json as exported")
    check_dtypes(weights, header.dtypes)


def check_dtypes(weights: Path, dtypes: dict[str, str]) -> None:
    """One floating dtype for every tensor. A header edited from F32 to I32 (the same bytes per value)
    would otherwise load integers' bit patterns as weights, converted without a word."""
    common = Counter(dtypes.values()).most_common(1)[0][0] if dtypes else "F32"
    if common not in FLOAT_DTYPES:
        raise DamagedFile(f"{weights}: its tensors are stored as {common}, not floating point "
                          f"({', '.join(FLOAT_DTYPES)}); export the model again")
    odd = [name for name, dtype in dtypes.items() if dtype != common]
    if odd:
        raise DamagedFile(f"{weights}: tensor {odd[0]} is stored as {dtypes[odd[0]]}, the others as {common} (a "
                          "model's weights share one dtype: an edited header?); export the model again")


def check_shapes(folder: Path, header: Header, model: EvalmModel) -> None:
    """Refuse tensors whose shapes differ from the (meta) model's, naming up to five."""
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    have = header.shapes
    wrong = [f"{k}: weights {have[k]}, config {want[k]}" for k in want if k in have and have[k] != want[k]]
    if wrong:
        raise DamagedFile(f"{folder / CONFIG} does not match the shapes in {folder / WEIGHTS}: {'; '.join(wrong[:5])}"
                          f"{f' (+{len(wrong) - 5} more)' if len(wrong) > 5 else ''}; restore config.json as exported")


def load_model(folder: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None) -> EvalmModel:
    """Check config.json against the weights' header, build the model, load the weights strictly; eval mode."""
    folder = Path(folder)
    config = load_config(folder)
    weights = folder / WEIGHTS
    if not weights.is_file():
        raise MissingInput(f"{weights}: weights missing")
    header = read_header(weights)
    check_header(folder, config, header)
    with torch.device("meta"):
        model = EvalmModel(config)
    check_shapes(folder, header, model)
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
