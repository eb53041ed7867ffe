"""A Hugging Face folder's safetensors weights checked against its config.json before any model is built.

Our own exports are checked so (evalm/io.py); a Hugging Face folder was handed to `transformers`,
which builds the model config.json describes and then fills it from the weights, reporting what did
not fit as a table of missing and unexpected keys (or not at all): `num_hidden_layers` one more than
the weights gave a random layer, one fewer dropped one, and `evalm convert` wrote either; a header
edited from F32 to I32 loaded integers' bit patterns as weights (q_proj values of 1.2e9);
`num_hidden_layers = 1000000000` built modules for hours. `check_weights` refuses each in one line
naming the file, from the safetensors headers alone (a few KB each; `safetensors` checks the
offsets against the file):

1. the header is readable (not truncated, offsets inside the file): else "damaged or truncated";
2. every tensor is floating point (unless config.json declares a quantization);
3. no layer count in config.json exceeds the layers the weights hold, before anything is built;
4. the model config.json describes, built on the meta device (no memory), has every tensor the
   weights hold and no other, each of the same shape: tensors `transformers` ties to another may be
   absent, and each class's own ignore lists are honoured.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from evalm.config_toolkit import MissingInput, UserError
from evalm.storage import DamagedFile, read_json

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
FLOATING = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")
LAYER_FIELDS = ("num_hidden_layers", "num_layers", "num_decoder_layers", "n_layer", "encoder_layers",
                "decoder_layers")
"""config.json keys that count layers, across model families."""
SHOWN = 4


def weight_files(folder: Path) -> list[Path]:
    """The folder's safetensors files (one, or the shards its index names); [] when it has none."""
    if (folder / SINGLE).is_file():
        return [folder / SINGLE]
    if (folder / INDEX).is_file():
        index = read_json(folder / INDEX)
        names = sorted(set(index.get("weight_map", {}).values())) if isinstance(index, dict) else []
        files = [folder / n for n in names if isinstance(n, str) and "/" not in n]
        missing = [f for f in files if not f.is_file()]
        if missing or not files:
            raise MissingInput(f"{folder / INDEX}: names {missing[0] if missing else 'no'} shard file; restore the "
                               "folder's weights as downloaded")
        return files
    return []


def header_of(path: Path, remedy: str) -> tuple[dict[str, str], dict[str, tuple[int, ...]], dict[str, str]]:
    """The metadata, tensor shapes and dtypes of one safetensors file, read from its header alone
    (`safetensors` checks the offsets against the file), or DamagedFile naming it and `remedy`. Our
    exports (evalm/io.py) and Hugging Face folders read their headers here."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            parts = {name: f.get_slice(name) for name in f.keys()}
            return (f.metadata() or {}, {name: tuple(p.get_shape()) for name, p in parts.items()},
                    {name: p.get_dtype() for name, p in parts.items()})
    except (SafetensorError, OSError, ValueError) as err:
        raise DamagedFile(f"{path}: damaged or truncated safetensors file ({str(err)[:200]}); {remedy}") from None


def read_headers(files: list[Path]) -> tuple[dict[str, tuple[int, ...]], dict[str, str]]:
    """Shapes and dtypes of every tensor of `files`, or DamagedFile naming the file."""
    shapes, dtypes = {}, {}
    for path in files:
        _, file_shapes, file_dtypes = header_of(path, "download or save the model again")
        shapes.update(file_shapes)
        dtypes.update(file_dtypes)
    return shapes, dtypes


def layers_held(names) -> int:
    """How many layers the weights can hold: one more than the largest index in any tensor name."""
    indices = [int(part) for name in names for part in name.split(".") if part.isdigit()]
    return max(indices) + 1 if indices else 0


def check_counts(folder: Path, config: dict[str, Any], shapes: dict[str, tuple[int, ...]], weights: Path) -> None:
    """Layer counts of config.json against the weights, before a model of that many layers is built."""
    held = layers_held(shapes)
    for key in LAYER_FIELDS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > held:
            raise DamagedFile(f"{folder / 'config.json'} does not describe {weights}: {key} {value}, but the weights "
                              f"hold {held} layer(s); restore config.json as the model was saved")


def check_dtypes(config: dict[str, Any], dtypes: dict[str, str], weights: Path) -> None:
    if config.get("quantization_config"):
        return  # integer blocks and their scales: the quantizer's own layout
    odd = sorted(name for name, dtype in dtypes.items() if dtype not in FLOATING)
    if odd:
        raise DamagedFile(f"{weights}: tensor {odd[0]} is stored as {dtypes[odd[0]]}, not floating point (an edited "
                          f"header? {len(odd)} such tensor(s)); download or save the model again")


def expected(model) -> tuple[dict[str, tuple[int, ...]], set[str], list[str], list[str]]:
    """The (meta) model's tensors and shapes, the names it may lack (tied to another), and its ignore patterns."""
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    tied: set[str] = set()
    for module in model.modules():
        keys = getattr(module, "_tied_weights_keys", None) or ()
        tied |= set(keys.keys() if isinstance(keys, dict) else keys)
    tied_full = {k for k in want if any(k == t or k.endswith("." + t) for t in tied)}
    missing_ok = list(getattr(model, "_keys_to_ignore_on_load_missing", None) or [])
    extra_ok = list(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or [])
    return want, tied_full, missing_ok, extra_ok


def aligned(have: dict[str, tuple[int, ...]], want: dict[str, tuple[int, ...]], prefix: str) -> dict:
    """The weights' names as the model names them: a base model's weights under a head model add the base
    prefix (`model.`), a head model's weights under a base model drop it (and the head)."""
    if not prefix or not have or not want:
        return have
    dotted = prefix + "."
    want_prefixed = any(k.startswith(dotted) for k in want)
    have_prefixed = any(k.startswith(dotted) for k in have)
    if want_prefixed and not have_prefixed:
        return {dotted + k if dotted + k in want else k: v for k, v in have.items()}
    if have_prefixed and not want_prefixed:
        return {k[len(dotted):]: v for k, v in have.items() if k.startswith(dotted)}
    return have


def compare(folder: Path, model, shapes: dict[str, tuple[int, ...]], weights: Path) -> None:
    """Every tensor of the model config.json describes is in the weights, none extra, shapes equal."""
    want, tied, missing_ok, extra_ok = expected(model)
    have = aligned(shapes, want, getattr(model, "base_model_prefix", ""))
    missing = sorted(k for k in set(want) - set(have)
                     if k not in tied and not any(re.search(p, k) for p in missing_ok))
    extra = sorted(k for k in set(have) - set(want) if not any(re.search(p, k) for p in extra_ok))
    wrong = [f"{k}: weights {have[k]}, config.json {want[k]}" for k in sorted(set(want) & set(have))
             if have[k] != want[k]]
    problems = ([f"shapes differ ({'; '.join(wrong[:SHOWN])}{' ...' if len(wrong) > SHOWN else ''})"] if wrong else []) \
        + ([f"{len(missing)} tensor(s) missing ({', '.join(missing[:SHOWN])}{' ...' if len(missing) > SHOWN else ''})"]
           if missing else []) \
        + ([f"{len(extra)} tensor(s) config.json has no place for ({', '.join(extra[:SHOWN])}"
            f"{' ...' if len(extra) > SHOWN else ''})"] if extra else [])
    if problems:
        raise DamagedFile(f"{folder / 'config.json'} does not describe {weights}: {'; '.join(problems)}; restore "
                          "config.json and the weights as the model was saved")


def check_weights(folder: str | Path, build, config: dict[str, Any], settings) -> int:
    """The checks of the module docstring on FOLDER's safetensors weights: `config` is its config.json,
    `settings(config)` the `transformers` config read from it (called only once the layer counts fit the
    weights) and `build(settings)` the model class that will load them (called on the meta device).
    Returns the weights' parameter count (0 when the folder has no safetensors weights: `.bin` files are
    read by transformers with weights_only=True)."""
    import torch

    folder = Path(folder)
    files = weight_files(folder)
    if not files:
        return 0
    weights = files[0] if len(files) == 1 else folder / INDEX
    shapes, dtypes = read_headers(files)
    check_dtypes(config, dtypes, weights)
    check_counts(folder, config, shapes, weights)
    try:
        read = settings()
    except (ValueError, TypeError, KeyError) as err:
        if isinstance(err, UserError):
            raise
        raise DamagedFile(f"{folder / 'config.json'}: not a config transformers can read ({str(err)[:200]}); restore "
                          "it as the model was saved") from None
    with torch.device("meta"):
        model = build(read)
    compare(folder, model, shapes, weights)
    return sum(math.prod(shape) for shape in shapes.values())
