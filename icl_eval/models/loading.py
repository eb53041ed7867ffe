"""The model an `evalm eval` command scores, by the kind of its `ModelSource` (models/source.py): one loader each.

A folder that cannot be loaded is one error naming `--checkpoint` and what to do: a
missing folder, and a training run folder (DCP checkpoints) that has not been exported yet.
"""

from __future__ import annotations

from pathlib import Path

from evalm.config_toolkit import ConfigError
from evalm.icl_eval.models.source import LoadOptions, ModelSource


def check_checkpoint(folder: str | Path) -> Path:
    """The exported folder, or an error saying how to get one."""
    folder = Path(folder)
    export = f"evalm export --checkpoint {folder} --out {folder}-model"
    if not folder.is_dir():
        raise ConfigError(f"--checkpoint {folder}: no such folder; give a folder written by `evalm export` "
                          "(model.safetensors + config.json)")
    if (folder / "model.safetensors").is_file() and (folder / "config.json").is_file():
        return folder
    if (folder / "checkpoints").is_dir() or (folder / ".metadata").is_file() or folder.name.startswith("step-"):
        raise ConfigError(f"--checkpoint {folder}: a training run (DCP checkpoints), not exported weights; "
                          f"run `{export}` and pass --checkpoint {folder}-model")
    missing = [f for f in ("model.safetensors", "config.json") if not (folder / f).is_file()]
    raise ConfigError(f"--checkpoint {folder}: {' and '.join(missing)} missing; give a folder written by `evalm export`")


def load_lm(source: ModelSource, options: LoadOptions, device: str):
    """The model of `source`, loaded on `device` (the rank's own, `World.device(options.device)`) with
    `options`: its dtype, its context window, EVA's ablation."""
    lm = SOURCES[source.kind](source, options, device)
    ablate_lm(lm, options.eva_ablation)
    select_lm(lm, options.eva_select)
    return lm


def _hf_tokenizer(source: ModelSource):
    from evalm.text.tokenizer import load_tokenizer

    if not Path(source.path).is_dir():
        raise ConfigError(f"--hf-model {source.path}: no such folder; give a local Hugging Face model folder")
    return load_tokenizer(source.tokenizer) if source.tokenizer else None


def _transformers(source: ModelSource, options: LoadOptions, device: str):
    """A causal LM folder (and its GGUF file, for kind gguf); an EVA folder loads with EVA's cache (models.hf)."""
    from evalm.icl_eval.models.hf import load_hf

    tok = _hf_tokenizer(source)
    lm = load_hf(source.checked or source.path, tokenizer=tok, dtype=options.dtype, device=device,
                 gguf_file=source.gguf_file)
    if options.context_window:
        lm.max_positions = options.context_window
    return lm


def _t5(source: ModelSource, options: LoadOptions, device: str):
    """An encoder-decoder: concat | saicl | fid | ensemble (icl_eval/methods/encoder_decoder.py)."""
    from evalm.icl_eval.models.t5 import load_t5

    tok = _hf_tokenizer(source)
    return load_t5(source.checked or source.path, tokenizer=tok, dtype=options.dtype, device=device)


def _evalm(source: ModelSource, options: LoadOptions, device: str):
    """An `evalm export` folder, with its tokenizer.json unless --tokenizer names another."""
    import torch

    from evalm.io import load_model
    from evalm.text.tokenizer import load_tokenizer
    from evalm.icl_eval.models.lm import EvalmLM

    ckpt = check_checkpoint(source.path)
    tok_path = source.tokenizer or (ckpt / "tokenizer.json" if (ckpt / "tokenizer.json").is_file() else None)
    model = load_model(ckpt, device=device, dtype=getattr(torch, options.dtype))
    tokenizer = load_tokenizer(tok_path)
    check_vocab(tokenizer, tok_path or "bytes", model.config.vocab_size, ckpt)
    return EvalmLM(model, tokenizer, name=str(ckpt), max_positions=options.context_window)


def _tiny(source: ModelSource, options: LoadOptions, device: str):
    return tiny_default(source.model, source.synthetic, options.context_window)


SOURCES = {"evalm": _evalm, "transformers": _transformers, "gguf": _transformers, "t5": _t5, "tiny": _tiny}
"""The loader of each kind of model source (`models.source.KINDS`): (source, options, device) -> the LM."""


def ablate_lm(lm, ablation: str) -> None:
    """EVA's component ablation (evalm/tiling.py, `Ablation`; `--eva-ablation`) on every EVA layer of the
    loaded model. A model with none is refused: it would be scored intact under the ablation's name."""
    if ablation == "none":
        return
    from evalm.eva import ablate

    model = getattr(lm, "model", None)
    if model is None or ablate(model, ablation) == 0:
        raise ConfigError(f"--eva-ablation {ablation}: {lm.name} has no EVA attention layer to ablate; give an EVA "
                          "model (an EVALM --checkpoint, an EVA --hf-model) or --eva-ablation none")


def select_lm(lm, k: int | None) -> None:
    """EVA with selection of k chunks (`--eva-select`; docs/eva.md, "Selection") on every EVA layer of the
    loaded model, its weights unchanged (None: the model's own setting). A model without EVA attention is refused
    for k > 0: it would be scored without selection under selection's name."""
    if k is None:
        return
    from evalm.eva import select

    model = getattr(lm, "model", None)
    if (model is None or select(model, k) == 0) and k:
        raise ConfigError(f"--eva-select {k}: {lm.name} has no EVA attention layer to select in; give an EVA "
                          "model (an EVALM --checkpoint, an EVA --hf-model) or --eva-select 0")


def check_vocab(tokenizer, tok_path, model_vocab: int, ckpt: Path) -> None:
    """A tokenizer whose ids reach past the model's embedding rows cannot be scored with it (the first id
    past the table is an index error deep in the model): refused here, naming both."""
    if tokenizer.vocab_size > model_vocab:
        raise ConfigError(f"tokenizer {tok_path}: {tokenizer.vocab_size} ids, but the model {ckpt} has {model_vocab} "
                          "(its vocab_size): not the tokenizer it was trained with; pass that one with --tokenizer "
                          "(`evalm export` writes it beside the weights as tokenizer.json)")


def tiny_default(model_cfg, syn, context_window: int | None):
    """The built-in default: a tiny EVALM trained here on the synthetic family (seconds on a CPU)."""
    import torch

    from evalm import EvalmModel
    from evalm.text.tokenizer import ByteTokenizer
    from evalm.icl_eval.models.lm import EvalmLM
    from evalm.icl_eval.tasks.synthetic import train_tiny_model

    torch.manual_seed(syn.seed)
    model = EvalmModel(model_cfg)
    model.init_weights()
    print(f"no --checkpoint: training a tiny EVALM ({model_cfg.attention}) on the synthetic family, {syn.train_steps} steps")
    losses = train_tiny_model(model, syn, log_every=max(1, syn.train_steps // 5))
    return EvalmLM(model, ByteTokenizer(), name=f"tiny synthetic-trained EVALM (final loss {losses[-1]:.3f})",
                   max_positions=context_window)


def describe(lm) -> dict:
    desc = lm.describe()
    desc["tokenizer"] = getattr(lm.tokenizer, "name", None) or str(getattr(lm.tokenizer, "path", type(lm.tokenizer).__name__))
    return desc
