"""A Hugging Face folder's weights checked against its config.json before any model is built.

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

Which files are the weights (`weight_files`) is decided here, in `transformers`' order: model.safetensors,
its index, pytorch_model.bin, its index. An index names its shards by file name: a name with a `/`, an
absolute path or `..` is refused (the library opened whatever the name made, so another file's tensors
entered a conversion, and a FIFO hung it), and so is a shard that is not a regular file.

`.bin` weights are a zip of pickled tensors, never unpickled here: their tensor names are read from
the pickle's opcodes (evalm/torch_zip.py), so that 3. holds for them too, before the model config.json
describes is built on the meta device to count its parameters (the memory estimate).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from evalm.config_toolkit import InputError, MissingInput, UserError
from evalm.hf_config import LAYER_KEYS
from evalm.storage import DamagedFile, read_json, regular

SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"
BIN, BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
FORMATS = ((SINGLE, INDEX), (BIN, BIN_INDEX))
"""The weights `transformers` loads from a local folder, in the order it looks for them."""
FLOATING = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")
SHOWN = 4


def weight_files(folder: Path) -> tuple[Path, ...]:
    """The folder's weights: one file, or the shards its index names, of the first format present; () for none."""
    for single, index in FORMATS:
        if (folder / single).is_file():
            return (folder / single,)
        if (folder / index).is_file():
            return shards(folder / index)
    return ()


def shards(index: Path) -> tuple[Path, ...]:
    """The shard files an index names, each a plain file name of a regular file beside it."""
    data = read_json(index, "a weights index")
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise DamagedFile(f"{index}: no weight_map naming the shards; restore the folder's weights as downloaded")
    names = sorted({str(n) if not isinstance(n, str) else n for n in weight_map.values()})
    for name in names:
        if not name or name != Path(name).name or name in (".", "..") or "\\" in name:
            raise InputError(f"{index}: shard {name!r} is not a plain file name inside {index.parent}; an index names "
                             "its shards by file name only: restore the folder's weights as downloaded")
    files = tuple(index.parent / name for name in names)
    for path in files:
        if not (path.exists() or path.is_symlink()):
            raise MissingInput(f"{index}: names shard {path.name}, which is not in the folder; restore the folder's "
                               "weights as downloaded")
        regular(path, "a model folder's weights")
    return files


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
    for key in LAYER_KEYS:
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


def check_weights(folder: Path, files: tuple[Path, ...], build, config: dict[str, Any], settings) -> int:
    """The checks of the module docstring on FOLDER's weights `files` (`weight_files`): `config` is its
    config.json, `settings()` the `transformers` config read from it (called only once the layer counts fit
    the weights) and `build(settings)` the model class that will load them (called on the meta device).
    Returns the parameter count: the safetensors' own, or the meta model's for `.bin` weights."""
    from evalm.torch_zip import tensor_names

    safetensors = files[0].suffix == ".safetensors"
    weights = files[0] if len(files) == 1 else folder / (INDEX if safetensors else BIN_INDEX)
    if safetensors:
        shapes, dtypes = read_headers(list(files))
        check_dtypes(config, dtypes, weights)
    else:
        shapes = {name: () for path in files for name in tensor_names(path)}
    check_counts(folder, config, shapes, weights)
    model = meta_model(folder, build, settings)
    if not safetensors:
        return sum(p.numel() for p in model.parameters())
    compare(folder, model, shapes, weights)
    return sum(math.prod(shape) for shape in shapes.values())


def meta_model(folder: Path, build, settings):
    """The model config.json describes, on the meta device (no memory); a config transformers cannot read is
    one line naming it."""
    import torch

    try:
        read = settings()
    except (ValueError, TypeError, KeyError) as err:
        if isinstance(err, UserError):
            raise
        raise DamagedFile(f"{folder / 'config.json'}: not a config transformers can read ({str(err)[:200]}); restore "
                          "it as the model was saved") from None
    with torch.device("meta"):
        return build(read)
