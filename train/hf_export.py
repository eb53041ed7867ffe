"""`evalm export --hf`: an EVALM as a `transformers` model folder.

    evalm export --hf --checkpoint runs/tiny/msit --out runs/tiny/hf
    python -c "from transformers import AutoModelForCausalLM as M; M.from_pretrained('runs/tiny/hf', trust_remote_code=True)"

`--checkpoint` is a training checkpoint (a run folder or a `step-XXXXXXXX` folder) or a folder
`evalm export` wrote. The folder written holds:

| file | what |
|---|---|
| model.safetensors | the weights under `EvalmModel`'s names, as `evalm export` writes them |
| config.json | a `transformers` config: model_type "evalm", the `ModelConfig` as its `evalm` section, `auto_map` to modeling_evalm.py |
| modeling_evalm.py | names evalm's classes (evalm/hf_evalm.py): loading needs `pip install 'evalm[hf]'` of the evalm version that wrote it (it refuses any other), the model's code is evalm's |
| tokenizer.json, tokenizer_config.json | a `transformers` tokenizer encoding as the run's (text/hf_tokenizer.py) |
| export.json | what it was exported from, and the modeling file's evalm version and SHA-256 |

The files are written in a staging folder and moved into `--out` complete, config.json last
(storage/staging.py); `--out` is a new or empty folder or one `evalm export` made, never the checkpoint.

The folder is also an exported EVALM (`evalm eval icl --checkpoint OUT` reads its `evalm` section).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from evalm.config_toolkit import ConfigError
from evalm.io import load_model, save_model
from evalm.storage import RunFolder, staged, write_atomic, write_json
from evalm.text.hf_tokenizer import save_hf_tokenizer
from evalm.text.tokenizer import ByteTokenizer, load_tokenizer
from evalm.train.identity import run_tokenizer

MODELING = '''"""EVALM for `transformers`, written by `evalm export --hf` (evalm {version}).

The model's code is evalm's own (evalm/hf_evalm.py: the decoder, EVA attention through the
`transformers` attention interface, circular positions, the T5 bias, the EVA cache), of the version
that wrote this folder: install `pip install 'evalm[hf]=={version}'`, then
`AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`, or, without remote code,
`import evalm; evalm.register_with_transformers()` first.
"""

from importlib.metadata import version

WRITTEN_BY = "{version}"
if version("evalm") != WRITTEN_BY:
    raise ImportError(f"this folder was written by evalm {{WRITTEN_BY}}, and evalm {{version('evalm')}} is installed: "
                      f"pip install 'evalm=={{WRITTEN_BY}}', or load it without this file (evalm.register_with_transformers())")

from evalm.hf_evalm import EvalmConfig, EvalmForCausalLM  # noqa: E402

__all__ = ["EvalmConfig", "EvalmForCausalLM"]
'''
MODELING_FILE = "modeling_evalm.py"
AUTO_MAP = {"AutoConfig": "modeling_evalm.EvalmConfig", "AutoModelForCausalLM": "modeling_evalm.EvalmForCausalLM"}


def _source(checkpoint: Path, load: Callable):
    """The model, where it came from, the tokenizer found with it: an exported folder, else a training
    checkpoint read by `load` (train/export.py's `checkpoint_model`)."""
    if (checkpoint / "model.safetensors").is_file() and (checkpoint / "config.json").is_file():
        tokenizer = checkpoint / "tokenizer.json"
        return load_model(checkpoint), checkpoint, tokenizer if tokenizer.is_file() else None
    model, path, run_config = load(checkpoint)
    return model, path, run_tokenizer(run_config.get("data", {}))


def _tokenizer(given: str | Path | None, found: Path | None, vocab_size: int) -> Path | None:
    """The tokenizer file to convert (None: raw bytes), checked against the model's vocabulary."""
    source = Path(given) if given else found
    if source is None and vocab_size != ByteTokenizer.vocab_size:
        raise ConfigError(f"--checkpoint: no tokenizer found for a {vocab_size}-token vocabulary (bytes have "
                          f"{ByteTokenizer.vocab_size}); pass --tokenizer FILE (the run's tokenizer.json)")
    size = load_tokenizer(source).vocab_size
    if size > vocab_size:
        raise ConfigError(f"--tokenizer {source}: {size} tokens do not fit the model's vocab_size={vocab_size}")
    return source


def export_hf(checkpoint: str | Path, out: str | Path, tokenizer: str | Path | None, load: Callable) -> Path:
    """Write the `transformers` folder of an EVALM checkpoint (module docstring); returns it. `load`
    reads a training checkpoint: (model, checkpoint folder, run config)."""
    from importlib.metadata import version

    from evalm.hf_evalm import EvalmConfig

    model, path, found = _source(Path(checkpoint), load)
    if model.config.attention != "eva":
        raise ConfigError(f"--checkpoint {checkpoint}: attention={model.config.attention!r}; --hf exports EVA models "
                          "(a full-attention EVALM is evaluated with --checkpoint)")
    source = _tokenizer(tokenizer, found, model.config.vocab_size)
    with RunFolder(out, "evalm export", inputs=[checkpoint]).held() as folder, staged(folder.path) as stage:
        save_model(model.eval(), stage)
        eos = save_hf_tokenizer(source, stage)
        eos_id = load_tokenizer(source).eos_id
        config = EvalmConfig.of(model.config, eos_token_id=eos_id, architectures=["EvalmForCausalLM"],
                                auto_map=AUTO_MAP)
        config.save_pretrained(stage)
        modeling = MODELING.format(version=version("evalm"))
        write_atomic(stage / MODELING_FILE, modeling)
        write_json(stage / "export.json", {
            "checkpoint": str(path), "tokenizer": str(source) if source else "bytes", "eos_token": eos,
            "transformers": True, "modeling": {"file": MODELING_FILE, "evalm": version("evalm"),
                                               "sha256": hashlib.sha256(modeling.encode()).hexdigest()}})
    return folder.path
