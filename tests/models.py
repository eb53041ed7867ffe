"""Small random decoders whose attention patterns are visible in their outputs, for tests."""

from __future__ import annotations

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
