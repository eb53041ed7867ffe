"""Window-only attention (evalm/window_attention.py): EVA's block-local softmax without the summaries.

    python -m pytest tests/evalm/test_window_attention.py -q

Oracles, float64: one dense softmax over every key, masked by the visibility rule written out here
(docs/eva.md's local block: ⌊i/w⌋·w − ext ≤ j ≤ i); exact attention inside the first block, where the
two rules coincide; EVA with `exclude_window_chunks` inside the first block (no chunk before it: the
same softmax) and not past it (the summaries are what the variant removes); the model's one-shot
forward for every split into segments and forks.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from evalm import EvalmModel, ModelConfig
from evalm.cache import merge
from evalm.window_attention import WindowState
from tests import models

EXACT = 1e-10  # float64: sums reassociated, nothing else
BASE = ModelConfig(vocab_size=61, d_model=32, n_layer=2, n_head=4, d_ff=64, window_size=8, chunk_size=4,
                   circular_period=64, dropout=0.0, attn_dropout=0.0, attention="window")


def model(**changes) -> EvalmModel:
    """BASE with `changes`, every matrix drawn from N(0, 0.3²) (tests/models.py's reason), float64."""
    return models.visible_model(dataclasses.replace(BASE, **changes)).double().eval()


def tokens(n: int, batch: int = 1, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, BASE.vocab_size, (batch, n), generator=torch.Generator().manual_seed(seed))


def dense(attn, x: torch.Tensor, ext: int) -> torch.Tensor:
    """The rule written out: every key scored, the invisible ones masked, one softmax."""
    q, k, v = attn.qkv(x)
    T, w = x.shape[1], attn.window
    i, j = torch.arange(T).view(-1, 1), torch.arange(T).view(1, -1)
    visible = (j <= i) & (j >= (i // w * w - ext).clamp(min=0))
    logits = (q @ k.transpose(-1, -2) / math.sqrt(attn.head_dim)).masked_fill(~visible, float("-inf"))
    return attn.merge(torch.softmax(logits, -1) @ v)


@pytest.mark.parametrize("overlap", [False, True])
def test_the_block_local_rule_against_a_dense_masked_softmax(overlap):
    attn = model(overlap_window=overlap).blocks[0].attn
    x = torch.randn(2, 45, BASE.d_model, dtype=torch.float64)
    with torch.no_grad():
        assert (attn(x) - dense(attn, x, BASE.window_size if overlap else 0)).abs().max() < EXACT


def test_inside_the_first_block_it_is_exact_attention_and_eva_without_earlier_chunks():
    window, full = model(), model(attention="full")
    eva = model(attention="eva", exclude_window_chunks=True)
    for other in (full, eva):
        other.load_state_dict(window.state_dict(), strict=False)  # q/k/v/out, MLPs, norms, embeddings
    short, long = tokens(BASE.window_size), tokens(3 * BASE.window_size)
    with torch.no_grad():
        assert (window(short) - full(short)).abs().max() < EXACT
        assert (window(short) - eva(short)).abs().max() < EXACT
        assert (window(long) - eva(long)).abs().max() > 1e-3  # past the block EVA reads its summaries
        assert (window(long) - full(long)).abs().max() > 1e-3


@pytest.mark.parametrize("overlap", [False, True])
def test_segments_and_forks_equal_the_one_shot_forward(overlap):
    m = model(overlap_window=overlap)
    x = tokens(61, batch=2)
    with torch.no_grad():
        whole = m(x)
        cache, parts = m.new_cache(batch_size=2), []
        for lo, hi in ((0, 3), (3, 11), (11, 12), (12, 30), (30, 61)):
            parts.append(m(x[:, lo:hi], cache=cache))
        assert (torch.cat(parts, 1) - whole).abs().max() < EXACT
        trunk = m.new_cache()
        m(x[:1, :29], cache=trunk)
        tails = tokens(9, batch=3, seed=5)
        batched = m(tails, cache=trunk.fork(batch_size=3))
        for b in range(3):
            alone = m(torch.cat([x[:1, :29], tails[b : b + 1]], 1))[:, 29:]
            assert (batched[b : b + 1] - alone).abs().max() < EXACT
    rows = BASE.window_size * (2 if overlap else 1)
    assert all(isinstance(s, WindowState) and s.k.shape[-2] <= rows for s in cache.layers)  # nothing older is kept


def test_a_merged_prefix_is_read_in_the_same_softmax_with_the_own_bias():
    """Structured Prompting's merge (evalm/cache.py): new tokens see every group's entries unbiased and
    their own block's keys with log M added; the oracle scores the same keys densely."""
    m = model()
    groups = [m.new_cache() for _ in range(2)]
    with torch.no_grad():
        for g, n in zip(groups, (13, 20)):
            m(tokens(n, seed=n), cache=g)
        merged = merge(groups, own_logit_bias=math.log(2), position_offset=20)
        x = torch.randn(1, 11, BASE.d_model, dtype=torch.float64)
        attn = m.blocks[0].attn
        out = attn(x, merged)
        pk, pv = merged.prefix[0]
        q, k, v = attn.qkv(x)
        i, j = torch.arange(11).view(-1, 1), torch.arange(11).view(1, -1)
        own = (q @ k.transpose(-1, -2) / math.sqrt(attn.head_dim)).masked_fill(~((j <= i) & (j >= i // 8 * 8)),
                                                                               float("-inf")) + math.log(2)
        shared = q @ pk.transpose(-1, -2) / math.sqrt(attn.head_dim)
        probs = torch.softmax(torch.cat([shared, own], -1), -1)
        expected = attn.merge(probs @ torch.cat([pv.expand(1, -1, -1, -1), v], -2))
        assert (out - expected).abs().max() < EXACT


def test_t5_bias_is_refused():
    with pytest.raises(ValueError, match="no T5 bias"):
        EvalmModel(dataclasses.replace(BASE, use_t5_bias=True))
