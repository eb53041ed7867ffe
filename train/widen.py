"""`evalm convert --widen`: a converted folder with a wider EVA window, the weights untouched.

    evalm convert --widen --hf-model runs/convert/lora-original/hf --out runs/convert/lora-original/hf-8192 --window 8192

A window is how attention is computed, not a parameter: the widened folder is the converted one with
`window_size` changed in its config.json's `evalm` section (validated as a conversion's settings are,
evalm/eva_settings.py, within the conversion's bound `MAX_WINDOW`), every other file copied as it is. It
is a conversion of a converted model, so it is a mode of `evalm convert`.

OUT follows the folder rules of every command (`storage.RunFolder`): never the model it reads nor a
folder inside it, never another command's folder (a training run, an export, the user's own), written
staged with config.json last. The copy never follows a link: a folder holding one is refused, naming it
(a `loop -> .` link was copied forty levels deep). A relaunch returns a finished folder made from the same
model and window, and refuses one made otherwise unless `--overwrite`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from evalm.config_toolkit import ConfigError, InputError, MissingInput, build
from evalm.storage import NotOurs, RunFolder, read_json, staged, write_json
from evalm.storage.run_folder import BOOKKEEPING, is_empty
from evalm.storage.staging import STAGING

COMMAND = "evalm convert --widen"
"""The made-by name of a widened folder (its marker)."""
RECORD = "widened.json"
"""What a widened folder was made from: the model's identity and the window."""


def model_files(model: Path) -> list[Path]:
    """The files of MODEL to copy (relative), its own bookkeeping and staging left out; a symbolic link anywhere
    in it is refused, naming it, and never followed."""
    files = []
    for top, dirs, names in os.walk(model):
        for name in [*dirs, *names]:
            path = Path(top) / name
            if path.is_symlink():
                raise InputError(f"{path} is a symbolic link (to {os.readlink(path)}); --widen copies a converted "
                                   "folder and never follows a link: replace the link with the file it names")
        dirs[:] = [d for d in dirs if not d.startswith(STAGING)]
        files += [(Path(top) / n).relative_to(model) for n in names if top != str(model) or n not in BOOKKEEPING]
    return files


def widened_config(model: Path, window: int, bound: int):
    """MODEL's config (`EvaLlamaConfig`) with EVA's window set to `window` (at most `bound`, the conversion's
    `MAX_WINDOW`), every check of a conversion's settings applied to it (named after the file)."""
    from evalm import hf_folder
    from evalm.eva_settings import EVA_FIELDS, EvaSettings
    from evalm.hf_llama import EvaLlamaConfig

    if not (model / "config.json").is_file():
        raise MissingInput(f"{model}: no config.json; --hf-model is a folder `evalm convert` (or an uptraining run's "
                           "hf/) wrote")
    if not 1 <= window <= bound:
        raise ConfigError(f"--window {window}: at most {bound} tokens, as for any conversion (a window past any "
                          "input is the input itself: give at most the longest context you evaluate)")
    raw = read_json(model / "config.json", "a model's config.json")
    if not isinstance(raw, dict) or raw.get("model_type") != "eva_llama":
        raise InputError(f"{model / 'config.json'}: not a converted model's config (an object with model_type "
                         "'eva_llama'); --widen takes a folder `evalm convert` wrote")
    config = hf_folder.pretrained(EvaLlamaConfig, model)
    where = f"{model / 'config.json'} [evalm]"
    if config.evalm.get("positions") == "circular" and config.evalm.get("circular_period") == config.evalm["window_size"]:
        raise InputError(f"{where}: block positions (a period of one window) are tied to the window; convert the "
                         "model again with the wider window instead")
    section = {**config.evalm, "window_size": window}
    build(EvaSettings, {k: section[k] for k in EVA_FIELDS if k in section}, where=where)
    EvaLlamaConfig(evalm=section)  # the section's own checks (its keys, positions)
    config.evalm = section
    return config


def widen(model: str | Path, out: str | Path, window: int, bound: int, overwrite: bool = False) -> Path:
    """OUT: the converted folder MODEL with EVA's window set to `window` (`widened_config`; `bound`: the
    conversion's, which `evalm convert` passes), every other file copied as it is."""
    from evalm.hf_private import unmarked

    model = Path(model)
    config = widened_config(model, window, bound)
    files = model_files(model)
    target = RunFolder(out, COMMAND, inputs=[model])
    target.refuse_inputs()
    target.claim()  # before the lock file is made: nothing written into a folder it may not write (again when held)
    with target.held() as run:
        made_from = {"model": str(model), "identity": run.identity(model), "window": window}
        if overwrite:
            run.discard(inputs=[model])
        if (run.path / "config.json").is_file():
            before = read_json(run.path / RECORD) if (run.path / RECORD).is_file() else None
            if isinstance(before, dict) and {k: before.get(k) for k in ("identity", "window")} == \
                    {k: made_from[k] for k in ("identity", "window")}:
                return run.path
            raise NotOurs(f"{run.path} holds another widening (of {before.get('model') if isinstance(before, dict) else '?'}"
                          f", window {before.get('window') if isinstance(before, dict) else '?'}); --overwrite "
                          "widens it again, or choose another --out")
        if not is_empty(run.path):
            run.discard(inputs=[model])  # a widen killed before its config landed
        with staged(run.path) as stage:  # the folder's config.json moved in last: never half a model
            for name in files:
                (stage / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(model / name, stage / name, follow_symlinks=False)
            with unmarked(type(config)):  # its own auto_map, not evalm's source (evalm.hf_private)
                config.save_pretrained(stage)
            write_json(stage / RECORD, made_from)
    return run.path
