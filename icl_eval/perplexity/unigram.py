"""The unigram reference of perplexity (docs/evaluation.md): token frequencies of the training tokens.

A model that has learned anything about language must beat the unigram model fitted on its own
training tokens; a perplexity above it means the model is damaged, whatever its trend with
context. The counts come from the token-shard folder that pretraining read (the format of
docs/training.md, "Tokenizer and token shards": `manifest.json` naming the dtype and shards, flat `.bin` arrays),
read here directly with numpy so evaluation does not import the training package. Add-one
smoothing keeps every id finite.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from evalm.config_toolkit import InputError, MissingInput
from evalm.storage import read_json


def fit_unigram(folder: str | Path, vocab_size: int) -> np.ndarray:
    """(V,) natural-log probabilities of each token id in the shards, add-one smoothed."""
    folder = Path(folder)
    manifest_path = folder / "manifest.json"
    if not manifest_path.is_file():
        raise MissingInput(f"{manifest_path}: not a token-shard folder (written by `evalm train tokenizer`); "
                           "pass the folder the model was pretrained on")
    manifest = read_json(manifest_path)
    if manifest["vocab_size"] > vocab_size:
        raise InputError(f"{folder}: its tokenizer has {manifest['vocab_size']} ids but the model only {vocab_size}; "
                         "pass the shards of the model's own tokenizer")
    counts = np.ones(vocab_size, dtype=np.float64)
    for shard in manifest["shards"]:
        ids = np.fromfile(folder / f"{shard['name']}.bin", dtype=np.dtype(manifest["dtype"]))
        counts += np.bincount(ids, minlength=vocab_size)[:vocab_size]
    return np.log(counts / counts.sum())
