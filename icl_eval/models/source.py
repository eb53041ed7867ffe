"""What an `evalm eval` command scores, typed at the command line's edge: a `ModelSource` and its `LoadOptions`.

A source is one of KINDS, chosen here and nowhere else from the flags (`ModelSource.of`): an EVALM
export (`--checkpoint`), a Hugging Face causal LM folder (`--hf-model`; an EVA folder of evalm's
classes is one too, `models.hf.load_hf` builds it with EVA's cache), a GGUF file in such a folder
(`--gguf-file`), a T5 folder (encoder-decoder), or the built-in tiny EVALM trained on the synthetic
family (neither flag). A folder goes through the gate once, here (`evalm.hf_folder.check_folder`): its
kind is read from the config.json the check read, and the `CheckedFolder` travels with the source to
its loader (`models.loading.SOURCES` maps each kind to one), which checks nothing again.

`LoadOptions` are how any source is loaded: the device, the dtype, the context window and EVA's
component ablation. They are declared once (`icl_eval.config.RunOptions`, which every command's section
inherits), offered as flags once (`cli_args.load_flags`), and recorded in recall's results.json as
`model_options`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pydantic.dataclasses import dataclass

from evalm.config_toolkit import FROZEN, ConfigError
from evalm.icl_eval.config import WindowedRunOptions

KINDS = {
    "evalm": "an EVALM export (--checkpoint: model.safetensors + config.json)",
    "transformers": "a Hugging Face causal LM folder (--hf-model), EVA folders of evalm's classes included",
    "gguf": "a GGUF file inside a Hugging Face folder (--hf-model with --gguf-file)",
    "t5": "a T5 (encoder-decoder) Hugging Face folder (--hf-model)",
    "tiny": "the built-in tiny EVALM, trained here on the synthetic family (neither --checkpoint nor --hf-model)",
}
"""Every kind of model source, with what it is; `models.loading.SOURCES` has one loader per kind."""

T5_MODEL_TYPES = ("t5", "mt5", "umt5")


@dataclass(config=FROZEN, frozen=True)
class LoadOptions(WindowedRunOptions):
    """How the model is loaded and run: the keys of `icl_eval.config.RunOptions` and the context window, declared
    there once; a switch of the model at evaluation time is one more field there."""

    @classmethod
    def of(cls, section: Any) -> LoadOptions:
        """The load options a command's settings section holds (`[eval]`, `[ppl]`, `[recall]`); a field
        the section has not (`[ppl]` sets no context window) keeps its default."""
        return cls(**{f.name: getattr(section, f.name) for f in dataclasses.fields(cls) if hasattr(section, f.name)})


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """One model to score: its kind (a key of KINDS) and its files, or the built-in model's sections."""

    kind: str
    path: str | None = None
    """The --checkpoint or --hf-model folder; None for the built-in model."""
    tokenizer: str | None = None
    """--tokenizer: tokenizer.json, a SentencePiece .model, or `bytes`; None: the source's own."""
    gguf_file: str | None = None
    """--gguf-file, inside `path`."""
    model: Any = None
    """The built-in model's `[model]` (a ModelConfig); None for the other kinds."""
    synthetic: Any = None
    """The built-in model's `[synthetic]` training (a SyntheticConfig); None for the other kinds."""
    checked: Any = dataclasses.field(default=None, compare=False, repr=False)
    """A --hf-model folder as the gate checked it (an `evalm.hf_folder.CheckedFolder`), for its loader; None for
    the other kinds and for a folder that is not there (its loader refuses it)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"model source kind {self.kind!r}; valid: {', '.join(KINDS)}")

    @classmethod
    def of(cls, checkpoint: str | None, hf_model: str | None, gguf_file: str | None, tokenizer: str | None,
           model: Any = None, synthetic: Any = None) -> ModelSource:
        """The source the model flags name: the one place a kind is chosen (a folder's from its config.json)."""
        if checkpoint:
            return cls("evalm", str(checkpoint), tokenizer)
        if hf_model:
            checked = check_hf_folder(hf_model, gguf_file)
            return cls(folder_kind(checked, gguf_file), str(hf_model), tokenizer, gguf_file, checked=checked)
        return cls("tiny", tokenizer=tokenizer, model=model, synthetic=synthetic)

    def inputs(self) -> list:
        """The model's files, which `--overwrite` must never delete."""
        return [self.path, None if self.tokenizer in (None, "bytes") else self.tokenizer]

    def key(self, folder) -> dict[str, Any]:
        """The model part of a resume key: its files by content (weights, config, tokenizer), not by name or time.
        `kind` keeps the flag's name (checkpoint, hf_model), so run folders of earlier versions still resume."""
        kind = {"evalm": "checkpoint", "tiny": None}.get(self.kind, "hf_model")
        tokenizer = self.tokenizer if self.tokenizer in (None, "bytes") else folder.identity(self.tokenizer)
        return {"kind": kind, "files": folder.identity(self.path) if self.path else None, "tokenizer": tokenizer}


def check_hf_folder(folder: str | Path, gguf_file: str | None):
    """The --hf-model folder through the gate, once for the whole load (a `CheckedFolder`); None when there is no
    such folder, which its loader refuses in the words of a missing folder."""
    from evalm import hf_folder

    return hf_folder.check_folder(folder, gguf_file) if Path(folder).is_dir() else None


def folder_kind(checked, gguf_file: str | None) -> str:
    """The kind of a checked --hf-model folder: t5 when its config.json declares an encoder-decoder, else gguf
    with --gguf-file, else transformers."""
    config = checked.config if checked is not None else {}
    if config.get("is_encoder_decoder") or config.get("model_type") in T5_MODEL_TYPES:
        return "t5"
    return "gguf" if gguf_file else "transformers"


def refuse_unless_decoder(source: ModelSource, command: str) -> None:
    """Decoding from a causal decoder's cache: an encoder-decoder source is refused before loading."""
    if source.kind == "t5":
        raise ConfigError(f"--hf-model {source.path}: an encoder-decoder (T5) cannot generate through a decoder "
                          f"cache; {command} needs a causal LM (a decoder-only --hf-model, or --checkpoint)")
