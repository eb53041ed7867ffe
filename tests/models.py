"""Small models and tasks for tests: random decoders whose attention patterns are visible in their
outputs, an exported byte-level model, a two-label task file."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from evalm import EvalmModel, ModelConfig


def visible_model(config: ModelConfig, seed: int = 0) -> EvalmModel:
    """A model of `config` with the reference inits, then every matrix redrawn from N(0, 0.3²).

    OPT's 0.006 init makes an untrained model nearly uniform; a larger scale makes attention
    patterns (and so any masking or ordering bug) visible in the scores.
    """
    torch.manual_seed(seed)
    model = EvalmModel(config)
    model.init_weights()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    return model


def byte_model(folder: Path) -> Path:
    """An exported one-layer EVALM over bytes (vocab 257) in `folder`, so eval commands load a model
    instead of training the built-in one."""
    from evalm.io import save_model

    torch.manual_seed(0)
    model = EvalmModel(ModelConfig(vocab_size=257, d_model=16, n_layer=1, n_head=2, d_ff=32, window_size=8,
                                   chunk_size=4, circular_period=512, dropout=0.0, attn_dropout=0.0))
    model.init_weights()
    return save_model(model, folder)


def two_label_task(folder: Path, n_train: int = 8, n_test: int = 4) -> Path:
    """A task file in `folder` whose rows `item i` alternate between two labels, train and test."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"text": f"item {i}", "label": i % 2} for i in range(n_train)]
    for split, part in (("train", rows), ("test", rows[:n_test])):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    path = folder / "task.toml"
    path.write_text('[task]\ntemplate = "{text} {label}"\nlabels = ["no", "yes"]\n'
                    'train = "train.jsonl"\ntest = "test.jsonl"\n')
    return path
