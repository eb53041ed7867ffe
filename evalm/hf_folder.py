"""A local Hugging Face model folder, opened the one way the project opens one: no code from it, ever, and
checked once per load.

`transformers` runs Python found in a model folder when the folder asks (`auto_map` in config.json,
tokenizer_config.json or any other of its JSON files) and `trust_remote_code` allows it; left unset,
it asks "Do you wish to run the custom code? [y/N]" at the prompt, and `y` runs it. Every loader of
the project goes through `pretrained` (tests/hostile/test_foreign_code.py finds any that does not),
which passes `trust_remote_code=False` and `local_files_only=True` explicitly, with a folder that has
been through `check_folder`, the gate, which refuses, in one line naming the file:

- a folder with anything but regular files at its top (a FIFO blocks a read forever, `/dev/zero` never ends);
- a `--gguf-file` outside the folder, not a regular file, or whose header claims what the file does not
  hold (evalm/gguf_file.py);
- a config.json that is missing, not JSON, not a JSON object, or larger than MAX_CONFIG_BYTES, or whose
  sizes or RoPE scaling are out of range (evalm/hf_config.py);
- a model_type `transformers` does not know (only a folder's own code could build it);
- an `auto_map` in any of its JSON files, except evalm's own shims in evalm's own folders (model_type
  "evalm" or "eva_llama", whose classes `evalm.register_with_transformers()` gives; the folder's
  modeling file is never imported);
- a weights index naming a shard that is not a plain file name of a regular file in the folder
  (evalm/hf_weights.py).

The gate returns a `CheckedFolder`, what it read (config.json, the weight files, the GGUF header's
summary), and every loader of one load takes that value instead of a path, so a load checks its folder
once: `model` (the weights checked against config.json and the memory they need estimated before any
model is built, from any format: safetensors headers, a `.bin` zip's tensor names, a GGUF header),
`tokenizer` (one that does not load, garbage or a `tokenizer.json` nested too deep for its reader, is
one line naming the folder) and `pretrained`. A path given to any of them is checked first. Checking
a plain folder imports `transformers` (config_toolkit's optional import), not EVA.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evalm.config_toolkit import InputError, MissingInput, transformers_module
from evalm.storage import DamagedFile, read_json
from evalm.storage.files import MiB, kind_of

CONFIG = "config.json"
MAX_CONFIG_BYTES = 16 * MiB
"""A config.json is kilobytes; a larger one is not a model's config."""
EVALM_TYPES = {"evalm": ("modeling_evalm.",), "eva_llama": ("modeling_eva_llama.",)}
"""evalm's own model types and the module its folders' `auto_map` names (never imported: the classes are
registered by `evalm.register_with_transformers`)."""
WEIGHT_NAMES = "model.safetensors, its index, pytorch_model.bin or its index"


@dataclass(frozen=True)
class CheckedFolder:
    """A model folder that passed `check_folder`, with what the check read; the loaders of one load take it."""

    path: Path
    config: dict[str, Any] = field(default_factory=dict)
    """config.json ({} for a GGUF folder without one)."""
    weights: tuple[Path, ...] = ()
    """The weight files `transformers` will read (evalm.hf_weights.weight_files); () with a GGUF file."""
    gguf_file: str | None = None
    """--gguf-file, inside `path`; its header's summary is `gguf`."""
    gguf: Any = None

    def options(self) -> dict[str, Any]:
        """The `from_pretrained` options that name the GGUF file, if any."""
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


class CustomCode(InputError):
    """A model folder that only its own Python code could load; evalm never runs it."""


def read_config(folder: str | Path) -> dict[str, Any]:
    """FOLDER/config.json as a dict: missing, not JSON, too large or not an object is one line naming it."""
    path = Path(folder) / CONFIG
    if not path.exists():
        raise MissingInput(f"{path}: not found; a Hugging Face model folder holds config.json (give the folder "
                           "`save_pretrained` wrote)")
    data = read_json(path, "a model's config.json", MAX_CONFIG_BYTES)
    if not isinstance(data, dict):
        raise DamagedFile(f"{path}: a JSON {type(data).__name__}, not the object a model's config is; restore it")
    return data


def check_files(folder: Path) -> None:
    """Every entry at the folder's top is a regular file or a folder (links followed)."""
    for entry in sorted(folder.iterdir()):
        try:
            mode = entry.stat().st_mode
        except OSError as err:
            raise InputError(f"{entry}: cannot be read ({err.strerror}: a loop of links, or a link to a file "
                             "that is gone?); remove it from the model folder") from None
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise InputError(f"{entry}: {kind_of(mode)}, not a regular file; a model folder holds regular files "
                             "only (remove it)")


def refuse_custom_code(folder: Path, config: dict[str, Any], known_type: bool = True) -> None:
    """An `auto_map` anywhere (except evalm's own shims in its own folders) or (`known_type`) a model_type
    `transformers` does not know: refused, naming the file."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    own = EVALM_TYPES.get(config.get("model_type"), ())
    for path in sorted(folder.glob("*.json")):
        data = config if path.name == CONFIG else _json_or_none(path)
        mapping = data.get("auto_map") if isinstance(data, dict) else None
        if not mapping:
            continue
        targets = [t for v in (mapping.values() if isinstance(mapping, dict) else [mapping])
                   for t in (v if isinstance(v, (list, tuple)) else [v]) if t]
        if path.name == CONFIG and own and all(isinstance(t, str) and t.startswith(own) for t in targets):
            continue  # evalm's shim: its classes come from evalm itself, the file is never imported
        named = ", ".join(map(str, targets[:3]))
        raise CustomCode(f"{path}: auto_map names code that ships with the folder ({named}); "
                         "evalm never runs a model folder's own code (trust_remote_code is always False): use a model "
                         "whose code ships with transformers, without auto_map")
    kind = config.get("model_type")
    if known_type and (not isinstance(kind, str) or kind not in CONFIG_MAPPING):
        raise CustomCode(f"{folder / CONFIG}: model_type {kind!r} is not one that transformers knows; only code "
                         "shipped with the folder could build it, and evalm never runs that: give a model of a type "
                         "transformers ships")


def _json_or_none(path: Path) -> Any:
    try:
        return read_json(path)
    except (DamagedFile, OSError, ValueError):
        return None  # read (and refused in its own words) by whatever loads it


def check_folder(folder: str | Path, gguf_file: str | None = None) -> CheckedFolder:
    """The gate (module docstring) on FOLDER and its GGUF_FILE; with a GGUF file, config.json may be absent
    (the GGUF holds the config)."""
    from evalm.hf_config import check_values
    from evalm.hf_weights import weight_files

    folder = Path(folder)
    if not folder.is_dir():
        raise MissingInput(f"{folder}: Hugging Face model folder not found")
    check_files(folder)
    summary = gguf(folder, gguf_file) if gguf_file else None
    transformers_module()
    if gguf_file and not (folder / CONFIG).exists():
        refuse_custom_code(folder, {}, known_type=False)  # the GGUF's architecture is checked by its reader
        return CheckedFolder(folder, {}, (), gguf_file, summary)
    config = read_config(folder)
    check_values(folder / CONFIG, config)
    if config.get("model_type") in EVALM_TYPES:
        from evalm import register_with_transformers

        register_with_transformers()
    refuse_custom_code(folder, config)
    return CheckedFolder(folder, config, () if gguf_file else weight_files(folder), gguf_file, summary)


def gate(folder: CheckedFolder | str | Path, gguf_file: str | None = None) -> CheckedFolder:
    """FOLDER as checked: itself when it has been through `check_folder` (this load's check), else checked now."""
    return folder if isinstance(folder, CheckedFolder) else check_folder(folder, gguf_file)


def pretrained(loader, folder: CheckedFolder | str | Path, **kwargs: Any):
    """`loader.from_pretrained(folder, **kwargs)`, the project's only call of it: on a checked folder (its GGUF
    file named), with local files only and never the folder's own code (`trust_remote_code=False`, explicitly)."""
    checked = gate(folder, kwargs.pop("gguf_file", None))
    return loader.from_pretrained(checked.path, **{**kwargs, **checked.options(), "local_files_only": True,
                                                   "trust_remote_code": False})


def gguf(folder: Path, gguf_file: str):
    """FOLDER/GGUF_FILE checked (evalm.gguf_file: inside the folder, a regular file, a header that fits it),
    the `gguf` package present, the file there; returns the header's summary."""
    from evalm.config_toolkit import require_gguf
    from evalm.gguf_file import check_gguf

    path, summary = check_gguf(folder, gguf_file)
    require_gguf()
    if summary is None:
        raise MissingInput(f"{path}: not found; --gguf-file names a file inside --hf-model {folder}")
    return summary


def model(loader, folder: CheckedFolder | str | Path, *, gguf_file: str | None = None, dtype=None,
          device: str = "cpu", **kwargs: Any):
    """A model of FOLDER through `loader` (an Auto class or a model class), checked before anything is
    built: the folder (`gate`), then its weights against its config.json (evalm.hf_weights) and the memory
    they take in `dtype` on `device` (evalm.footprint), estimated from the weights' headers; then `pretrained`."""
    import torch

    from evalm.footprint import check_fits
    from evalm.hf_weights import check_weights

    checked = gate(folder, gguf_file)
    if checked.gguf is not None:
        n = checked.gguf.parameters
    elif checked.weights:
        build = loader.from_config if loader.__name__.startswith("Auto") else loader
        n = check_weights(checked.path, checked.weights, build, checked.config,
                          lambda: pretrained(transformers_module().AutoConfig, checked))
    else:
        raise MissingInput(f"{checked.path}: no weights ({WEIGHT_NAMES}); a Hugging Face model folder holds the "
                           "weights `save_pretrained` wrote beside its config.json")
    size = torch.empty((), dtype=dtype or torch.float32).element_size()
    check_fits(n * size, f"{checked.path}: a model of {n:.3g} parameters in "
               f"{str(dtype or torch.float32).split('.')[-1]}", str(device))
    return pretrained(loader, checked, **({"dtype": dtype} if dtype is not None else {}), **kwargs)


def tokenizer(folder: CheckedFolder | str | Path, gguf_file: str | None = None):
    """The folder's `transformers` tokenizer (`pretrained(AutoTokenizer, ...)`); one that does not load is
    one line naming the folder."""
    checked = gate(folder, gguf_file)
    try:
        return pretrained(transformers_module().AutoTokenizer, checked)
    except (InputError, MissingInput, DamagedFile):
        raise
    except (Exception, RecursionError) as err:  # noqa: BLE001 - the tokenizer files are the input here
        first = f"{type(err).__name__}: {err}".splitlines()[0][:200]
        raise InputError(f"{checked.path}: its tokenizer does not load ({first}); restore the folder's tokenizer "
                         "files (tokenizer.json, tokenizer_config.json) as the model was saved with them") from None
