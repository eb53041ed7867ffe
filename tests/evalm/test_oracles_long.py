"""EVA oracles on the paths short sequences never reach (docs/eva.md, "Oracles": O1 at n in the thousands, O7).

Run: python -m pytest tests/evalm/test_oracles_long.py -q
- O1, n = 2,003 (not a multiple of w or c; ~500 chunks): the vectorised per-token oracle
  (tests/evalm/oracle.py) against every path a long sequence takes: the recomputing training
  attention on the fused kernel (evalm/flash.py) in 768-row remote groups, and in plain PyTorch
  (evalm/recompute.py) in many block groups with staircase chunk masks, the tiled
  autograd/eval path (`tiles.attend`) in 8 query tiles of 256 rows split over several
  tile groups, and incremental encoding through the cache in three uneven segments.
- O7, the block-local limit: with no remote entry, each query is exact softmax attention over its
  own block (plus the previous block with overlap), on every path, against a dense-mask oracle;
  a sliding window gives other numbers, so the oracle can tell blocks from windows.
float64 throughout; d_model 32 keeps it to a few seconds.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import evalm.flash
import evalm.recompute
from evalm import tile_call, tiles, whole_sequence
from evalm.cache import Cache
from evalm.eva_paths import EvaPath, Route
from evalm.tiling import Tiling
from evalm.whole_sequence import WholeSequence, eva_attention
from tests.evalm.oracle import eva_per_token, eva_per_token_vectorised, t5_bucket_ref
from tests.evalm.paths import PLAIN, TILES, forced
from tests.evalm.test_eva import BASE, EXACT, VARIANTS, make_attention

N_LONG = 2003
LONG_VARIANTS = ["w16c4-t5", "w8c4-overlap-t5", "w16c4-exclude"]


def _x(n: int, seed: int = 3) -> torch.Tensor:
    return torch.randn(1, n, BASE.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def test_the_vectorised_oracle_equals_the_scalar_one():
    for name in LONG_VARIANTS:
        attn = make_attention(**VARIANTS[name])
        x = _x(77)
        np.testing.assert_allclose(eva_per_token_vectorised(attn, x), eva_per_token(attn, x), rtol=0, atol=1e-14)


@pytest.mark.parametrize("name", LONG_VARIANTS)
def test_o1_long_sequence_on_the_recompute_tiled_and_cached_paths(name, monkeypatch):
    attn = make_attention(**VARIANTS[name])
    x = _x(N_LONG)
    want = eva_per_token_vectorised(attn, x)

    seen_remote, real_remote = [], evalm.flash.remote_groups
    monkeypatch.setattr(evalm.flash, "remote_groups", lambda *a: seen_remote.append(real_remote(*a)) or seen_remote[-1])
    with torch.no_grad():
        np.testing.assert_allclose(attn(x).numpy(), want, rtol=0, atol=EXACT)  # fused kernel, default groups
    assert len(seen_remote[0]) == 3 and all(g.prefix > 0 for g in seen_remote[0][1:])

    seen_groups, real_groups = [], evalm.recompute.groups
    monkeypatch.setattr(evalm.recompute, "groups", lambda *a: seen_groups.append(real_groups(*a)) or seen_groups[-1])
    with torch.no_grad(), forced(**PLAIN):
        np.testing.assert_allclose(attn(x).numpy(), want, rtol=0, atol=EXACT)  # plain-PyTorch path, default budget
    groups = seen_groups[0]
    assert len(groups) > 4 and any(g.b1 - g.b0 > 1 for g in groups)  # several groups of several blocks

    # The tiled path: 8 tiles of 256 rows; a smaller logit budget splits them into groups of 2.
    monkeypatch.setattr(tiles, "TILE_LOGITS", 1 << 21)
    calls, real_plan = [], tiles.plan

    def counted(*args):
        found = real_plan(*args)
        calls.append(found)
        return found

    monkeypatch.setattr(tiles, "plan", counted)
    with torch.no_grad(), forced(**TILES):
        np.testing.assert_allclose(attn(x).numpy(), want, rtol=0, atol=EXACT)
        whole = calls[0]  # several tile groups of several tiles
        assert whole.n_tiles == -(-N_LONG // 256) and whole.group > 1 and -(-whole.n_tiles // whole.group) > 2
        cache, outs, at = Cache(n_layer=1, batch_size=1), [], 0  # `attn` is layer 0
        for length in (700, 9, N_LONG - 709):  # segment boundaries inside blocks and chunks
            outs.append(attn(x[:, at : at + length], cache=cache))
            cache.advance(length)  # what EvalmModel.forward does after its layers
            at += length
    np.testing.assert_allclose(torch.cat(outs, 1).numpy(), want, rtol=0, atol=EXACT)


# ----------------------------------------------------------------------------------------------
# O7: the block-local limit.

def _block_local_oracle(q, k, v, w: int, ext: int, bias_by_distance: np.ndarray | None, sliding: bool = False):
    """Dense softmax over the keys max(0, ⌊i/w⌋·w − ext) ≤ j ≤ i (or a sliding i − w < j ≤ i), per head."""
    q, k, v = (t.numpy() for t in (q, k, v))  # (B, T, H, D)
    B, T, H, D = q.shape
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    lo = i - w + 1 if sliding else np.maximum(0, i // w * w - ext)
    visible = (j <= i) & (j >= lo)
    logits = np.einsum("bihd,bjhd->bhij", q, k) * D**-0.5
    if bias_by_distance is not None:
        logits = logits + bias_by_distance[np.clip(i - j - ext, 0, len(bias_by_distance) - 1)]
    logits = np.where(visible, logits, -np.inf)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhij,bjhd->bihd", p, v)


@pytest.mark.parametrize("name", ["w16c4-t5", "w8c4-overlap-t5", "w16c4"])
def test_o7_without_remote_entries_each_query_is_softmax_over_its_block(name):
    attn = make_attention(**VARIANTS[name])
    w, c, ext, H, D = attn.window_size, attn.chunk_size, attn.ext, attn.n_head, attn.head_dim
    n = 300  # more than one 256-row tile on the tiled path; a padded tail on the recompute path
    gen = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, n, H, D, dtype=torch.float64, generator=gen) for _ in range(3))
    s, bias_d, bias_block = D**-0.5, None, None
    if attn.rel_pos_bias is not None:  # the oracle's own T5 bias: s · table[bucket(max(0, i − j − ext))]
        table = attn.rel_pos_bias.relative_attention_bias.weight.detach()[:, 0].numpy()
        bias_d = np.array([s * table[t5_bucket_ref(d, len(table), w + ext)] for d in range(w + ext + 1)])
        rows, cols = np.arange(w)[:, None], np.arange(ext + w)[None, :]  # key col sits at block start − ext + col
        bias_block = torch.tensor(bias_d[np.clip(rows - cols, 0, None)])
    want = _block_local_oracle(q, k, v, w, ext, bias_d)
    t = Tiling(w, c, ext, False, s)
    with torch.no_grad():
        got = eva_attention(WholeSequence(t), q, k, v, bias_block)
        ops = eva_attention(WholeSequence(t, whole_sequence.PLAIN), q, k, v, bias_block)
        plan = tiles.plan(t, attn.query_tile, H, 0, n, 0)
        call = tile_call.TiledCall(t, plan, EvaPath(Route.TILES, "test"), tile_call.Entries((), (), None, 0.0), attn.rel_pos_bias)
        tiled = tiles.attend(call, *(z.transpose(1, 2) for z in (q, k, v))).transpose(1, 2)
    np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=EXACT)
    np.testing.assert_allclose(ops.numpy(), want, rtol=0, atol=EXACT)
    np.testing.assert_allclose(tiled.numpy(), want, rtol=0, atol=EXACT)
    sliding = _block_local_oracle(q, k, v, w, ext, bias_d, sliding=True)
    assert np.abs(sliding - want).max() > 1e-3  # blocks, not a sliding window: the oracle can fail
