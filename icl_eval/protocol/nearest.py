"""Nearest-demonstration diagnostics (ManyICLBench): is a many-shot gain retrieval or learning?

For each test item, the k demonstrations of its context most similar to it (TF-IDF cosine, the
same vectorizer as instance-level Top-k, `selection.TopK`, fitted on the training texts) are
- `remove`d (the rest stay, in their order),
- the only ones `keep`t (in their context order), or
- `corrupt`ed: shown with a wrong label (seeded per item and demonstration, uniform over the others).
Ties in similarity go to the demonstration nearer the test input (later in the context).
With `nearest_embedding` (a local Hugging Face encoder folder) the similarity is instead the cosine
of mean-pooled last hidden states (`Embedder`), computed only for the demonstrations in the context.
A task whose gain vanishes when the nearest are removed learns from similar samples; one whose
gain survives learns from all of them. The sample learning ratio condenses this:

    SLR = (acc_full - acc_remove) / (acc_full - acc_0)

the share of the gain over 0 shots that the k nearest demonstrations carry (reported with the
paired interval of acc_full - acc_remove; undefined, None, when the context gains nothing over 0 shots). Each item has
its own context here, so every method re-encodes it per item (no cache sharing across items);
the per-item cost is recorded as `seconds_per_item`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import numpy as np

from evalm.config_toolkit import ConfigError, UserError

MODES = ("remove", "keep", "corrupt")


class TooFewDemonstrations(UserError, ValueError):
    """k nearest asked of a context with fewer demonstrations."""


class Embedder:
    """Cosine similarity of mean-pooled last hidden states of a local encoder (no hub: local files only)."""

    def __init__(self, folder: str, text_of: Callable[[int], str]):
        from evalm import hf_folder
        from evalm.config_toolkit import transformers_module

        checked = hf_folder.check_folder(folder)  # once for both loads; no code from the folder (evalm.hf_folder)
        self.tokenizer = hf_folder.tokenizer(checked)
        self.model = hf_folder.model(transformers_module().AutoModel, checked).eval()
        self.text_of, self.cache = text_of, {}

    def embed(self, text: str) -> np.ndarray:
        """The unit-length mean of the last hidden states over the text's tokens, shape (D,)."""
        import torch

        batch = self.tokenizer([text], return_tensors="pt")
        with torch.no_grad():
            hidden = self.model(**batch).last_hidden_state[0]  # (T, D)
        mask = batch["attention_mask"][0].unsqueeze(-1).to(hidden.dtype)
        vec = ((hidden * mask).sum(0) / mask.sum()).double().numpy()
        return vec / max(np.linalg.norm(vec), 1e-12)

    def similarities(self, text: str, ids: Sequence[int]) -> dict[int, float]:
        """Cosine of `text` to each training text in `ids` (those embedded once and cached)."""
        query = self.embed(text)
        for i in ids:
            if i not in self.cache:
                self.cache[i] = self.embed(self.text_of(i))
        return {i: float(self.cache[i] @ query) for i in ids}


def nearest(sims, ids: Sequence[int], k: int) -> list[int]:
    """The k of `ids` (a context, in order) with the highest similarity `sims[i]` (an array over the
    training items, or a dict over `ids`); ties: later first."""
    if k > len(ids):
        raise TooFewDemonstrations(f"--nearest-k {k}: the context has only {len(ids)} demonstrations; "
                                   f"lower --nearest-k or raise the shots/budget")
    ranked = sorted(range(len(ids)), key=lambda p: (-sims[ids[p]], -p))
    return [ids[p] for p in ranked[:k]]


def apply(mode: str, ids: Sequence[int], near: Sequence[int], labels: Sequence[int], n_labels: int,
          rng: random.Random) -> tuple[list[int], dict[int, int]]:
    """The item's context under `mode`: its demonstration ids in order, and label overrides {id: shown label}."""
    if mode not in MODES:
        raise ConfigError(f"nearest mode {mode!r} is not known; valid: {', '.join(MODES)}")
    chosen = set(near)
    if mode == "remove":
        return [i for i in ids if i not in chosen], {}
    if mode == "keep":
        return [i for i in ids if i in chosen], {}
    wrong = {i: rng.choice([y for y in range(n_labels) if y != labels[i]]) for i in ids if i in chosen}
    return list(ids), wrong


def sample_learning_ratio(full: float, removed: float, zero: float) -> float | None:
    """The share of the gain over 0 shots lost when the nearest demonstrations are removed; None
    without a gain (a context no better than none has no gain to split)."""
    gain = full - zero
    return None if gain <= 1e-12 else (full - removed) / gain
