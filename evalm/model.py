"""The EVALM decoder (EVALM §3.1, docs/training.md): pre-LN blocks, EVA or exact attention, circular
positions, tied embeddings. Reads top-down: MLP, Block, EvalmModel. The attention of each block is
`attention_class(config.attention)` (evalm/attention.py).

The model knows nothing of files, tasks or distribution: `train/` shards it from outside (each
`Block`, then the root) and `icl_eval/` drives it only through `forward(tokens, targets, cache)`,
`new_cache` and `Cache.fork`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from evalm.attention import attention_class
from evalm.cache import Cache
from evalm.config import ModelConfig
from evalm.heads import upcast
from evalm.positions import CircularPositionalEmbedding


ACTIVATION = {"relu": nn.ReLU, "gelu": nn.GELU}


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, config.d_ff)
        self.act = ACTIVATION[config.activation]()
        self.fc2 = nn.Linear(config.d_ff, config.d_model)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(self.act(self.fc1(x))))


class Block(nn.Module):
    """Pre-LN residual block: the unit `train/parallelize.py` shards and checkpoints."""

    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = nn.LayerNorm(config.d_model)
        self.attn = attention_class(config.attention)(config, layer_idx)
        self.mlp_norm = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, cache: Cache | None = None) -> Tensor:
        x = x + self.drop(self.attn(self.attn_norm(x), cache))
        return x + self.mlp(self.mlp_norm(x))


class EvalmModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.embed_positions = CircularPositionalEmbedding(config.circular_period, config.d_model, config.positions)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.final_norm = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the output matrix with the input embedding (OPT). `to_empty` unties it: re-tie."""
        if self.config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @torch.no_grad()
    def init_weights(self) -> None:
        """Initialise every parameter; apart from __init__ so meta-device construction works.

        | parameter                          | init                                         |
        |------------------------------------|----------------------------------------------|
        | token and position embeddings      | N(0, init_std)   (OPT megatron sigma 0.006)  |
        | attention q/k/v, A_q/A_k weights   | Xavier-uniform, gain 1/√2 (EVA reference)    |
        | attention out_proj                 | Xavier-uniform, bias 0                       |
        | T5 bias table                      | N(0, 1)                                      |
        | MLP fc1/fc2, untied lm_head        | N(0, init_std), biases 0                     |
        | LayerNorms                         | weight 1, bias 0                             |
        """
        std = self.config.init_std
        self.tie_weights()
        nn.init.normal_(self.embed_tokens.weight, std=std)
        nn.init.normal_(self.embed_positions.weight, std=std)
        for block in self.blocks:
            block.attn.init_weights()
            for lin in (block.mlp.fc1, block.mlp.fc2):
                nn.init.normal_(lin.weight, std=std)
                nn.init.zeros_(lin.bias)
            block.attn_norm.reset_parameters()
            block.mlp_norm.reset_parameters()
        self.final_norm.reset_parameters()
        if not self.config.tie_embeddings:
            nn.init.normal_(self.lm_head.weight, std=std)

    def new_cache(self, batch_size: int = 1, position_offset: int = 0) -> Cache:
        """An empty incremental-encoding cache; `position_offset` is its first token's position."""
        return Cache(n_layer=self.config.n_layer, batch_size=batch_size, position_offset=position_offset)

    def forward(self, tokens: Tensor, targets: Tensor | None = None, cache: Cache | None = None) -> Tensor:
        """tokens (B, T) -> logits (B, T, V); with targets (B, T), the mean cross-entropy over
        targets != -100. With a cache, the tokens continue after everything it holds and the
        cache advances by T."""
        B, T = tokens.shape
        if cache is not None and B != cache.batch_size:
            raise ValueError(f"tokens have batch {B} but the cache was made for {cache.batch_size}")
        start = cache.get_pos() if cache is not None else 0
        x = self.drop(self.embed_tokens(tokens) + self.embed_positions(start, T))
        for block in self.blocks:
            x = block(x, cache)
        if cache is not None:
            cache.advance(T)
        logits = self.lm_head(self.final_norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(upcast(logits).flatten(0, 1), targets.flatten(), ignore_index=-100)

    def num_params(self) -> int:
        """Parameters counted once (the tied output matrix is the input embedding)."""
        return sum(p.numel() for p in self.parameters())
