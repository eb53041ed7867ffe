"""Attention dropout on the cached paths (evalm/tiles.py: "tiles", "forks") against the per-token oracle.

Training through a cache (SAICL-structured tuning, train/structure.py, encodes every line that
way) draws the same hashed keep mask as the whole-sequence paths (evalm/dropout_mask.py): the
query's position in its cache, the key's id (token position, −1 − r for chunk r, 2³⁰ + m for the
m-th merged prefix entry). So with the seed pinned, the tiled path, in one call or in segments,
with a merged prefix or over folded forks, equals `eva_per_token_torch` replaying that mask, and
equals the fused and plain paths: output and every gradient, float64, to 1e-10. SDPA's own dropout
(what this path used before) draws another mask from torch's RNG and fails each of these by the
dropped probabilities (~1e-2).
"""

from __future__ import annotations

import pytest
import torch

import evalm.tiles
from evalm.cache import Cache
from evalm.eva_paths import Route
from tests.evalm.oracle import eva_per_token_torch
from tests.evalm.paths import PLAIN, TILES, forced, recorded
from tests.evalm.test_eva import VARIANTS
from tests.evalm.test_fused_dropout import P, SEED, _dropping
from tests.evalm.test_recompute import _assert_same, _grads, _inputs


@pytest.mark.parametrize("name", ["w16c4-t5", "w8c4-overlap-t5", "w16c4-exclude"])
def test_every_path_draws_one_mask_equal_to_the_oracle(name, monkeypatch):
    """A whole sequence forced onto the tiles (several tiles, several groups), the fused kernel and
    the plain path, in training with attention dropout: each equals the oracle replaying the mask."""
    attn = _dropping(monkeypatch, **VARIANTS[name])
    x, weight = _inputs(300)
    want = _grads(attn, lambda x: eva_per_token_torch(attn, x, dropout=(SEED, P)), x, weight)
    monkeypatch.setattr(evalm.tiles, "TILE_LOGITS", 2 * 4 * 256 * 200)  # one tile per group
    for facts, route in (({}, Route.FUSED), (PLAIN, Route.RECOMPUTE), (TILES, Route.TILES)):
        with forced(**facts), recorded() as taken:
            got = _grads(attn, attn, x, weight)
        assert [path.route for path in taken] == [route] and not taken[0].split, facts
        _assert_same(got, want)
    undropped = eva_per_token_torch(attn, x).detach()
    assert (want["out"] - undropped).abs().max() > 1e-3  # dropout acts


@pytest.mark.parametrize("name", ["w16c4-t5", "w8c4-overlap-t5"])
def test_segments_through_a_cache_draw_the_one_shot_mask(name, monkeypatch):
    """Training through a cache in uneven segments: each query keeps its position and each key its
    id, so the segments together equal the oracle on the whole sequence, gradients included."""
    attn = _dropping(monkeypatch, **VARIANTS[name])
    x, weight = _inputs(77)

    def segments(x):
        cache, outs, at = Cache(n_layer=1, batch_size=2), [], 0
        for length in (5, 13, 1, 30, 28):
            outs.append(attn(x[:, at : at + length], cache=cache))
            cache.advance(length)
            at += length
        return torch.cat(outs, 1)

    with recorded() as taken:
        got = _grads(attn, segments, x, weight)
    assert {path.route for path in taken} == {Route.TILES} and not any(path.split for path in taken)
    _assert_same(got, _grads(attn, lambda x: eva_per_token_torch(attn, x, dropout=(SEED, P)), x, weight))


def test_a_merged_prefix_draws_its_own_key_ids(monkeypatch):
    """SAICL's shape: test queries in training over a cache whose prefix holds other caches'
    entries; the prefix entries are dropped by their ids 2³⁰ + m, as the oracle replays."""
    attn = _dropping(monkeypatch, **VARIANTS["w16c4-t5"])
    x, weight = _inputs(21)
    gen = torch.Generator().manual_seed(5)
    prefix = tuple(torch.randn(2, attn.n_head, 40, attn.head_dim, dtype=torch.float64, generator=gen) for _ in range(2))

    def over_prefix(x):
        return attn(x, cache=Cache(n_layer=1, batch_size=2, position_offset=9, prefix=[prefix]))

    with recorded() as taken:
        got = _grads(attn, over_prefix, x, weight)
    assert [path.route for path in taken] == [Route.TILES]
    want = _grads(attn, lambda x: eva_per_token_torch(attn, x, dropout=(SEED, P), prefix=prefix), x, weight)
    _assert_same(got, want)
    undropped = eva_per_token_torch(attn, x, prefix=prefix).detach()
    assert (got["out"] - undropped).abs().max() > 1e-3


def test_folded_forks_keep_each_rows_sequence_in_the_mask(monkeypatch):
    """Forks over one parent (rows of three sequences folded into one block) in training: fork b's
    rows draw sequence b's mask, as if each fork were row b of the whole batch."""
    attn = _dropping(monkeypatch, **VARIANTS["w16c4-t5"])
    parent_x, _ = _inputs(48, batch=1)
    fork_x, weight = _inputs(3, batch=3)
    parent = Cache(n_layer=1)
    with torch.no_grad():
        attn.eval()
        attn(parent_x, cache=parent)
        attn.train()
    parent.advance(48)

    with recorded() as taken:
        got = _grads(attn, lambda x: attn(x, cache=parent.fork(batch_size=3)), fork_x, weight)
    assert [path.route for path in taken] == [Route.FORKS]
    whole = torch.cat([parent_x.expand(3, -1, -1), fork_x], 1)
    want = eva_per_token_torch(attn, whole, dropout=(SEED, P))[:, 48:]
    torch.testing.assert_close(got["out"], want.detach(), rtol=0, atol=1e-10)
    undropped = eva_per_token_torch(attn, whole)[:, 48:].detach()
    assert (got["out"] - undropped).abs().max() > 1e-3
