"""Selection on the fused path (evalm/flash_selection.py): a whole sequence with `select_chunks` on PyTorch's fused
CPU kernel, training included.

    python -m pytest tests/evalm/test_flash_selection.py -q

The oracle is tests/evalm/test_eva_selection.py's rule written out in float64, its gradients autograd's through
it. The fused path must equal it in output and in every gradient (q, k, v, the adaptive maps, the T5 bias) with
its forward groups, backward groups and backward ranges made small, so the chosen tokens' gradients cross ranges
(a query's chunks lie before its window, in ranges backward has not reached); and the path must be the one taken.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import evalm.flash_sweep
from tests.evalm.paths import PLAIN, forced, recorded
from tests.evalm.test_eva_selection import APART, BASE, EXACT, SHAPES, heads, model, oracle

FUSED_SHAPES = ["k1", "k2", "k3-only", "k2-overlap-t5-exclude", "k2-bound"]  # no sink: the fused path reads none


def _small_groups(monkeypatch) -> None:
    """Forward groups of 16 queries, backward groups of 9 and ranges of 16 rows (two blocks of BASE's window 8), prefix
    calls of 3 chunks: a 45-token sequence crosses every boundary the sweeps have."""
    monkeypatch.setattr(evalm.flash_sweep, "ROWS", 16)
    monkeypatch.setattr(evalm.flash_sweep, "RANGE_ROWS", 16)
    monkeypatch.setattr(evalm.flash_sweep, "BACKWARD_ROWS", 9)
    monkeypatch.setattr(evalm.flash_sweep, "BACKWARD_CHUNKS", 3)


def _grads(attn, q, k, v, weight, params, run):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = run(attn, q, k, v)
    return out, torch.autograd.grad((out * weight).sum(), [q, k, v, *params], allow_unused=True)


@pytest.mark.parametrize("shape", FUSED_SHAPES)
def test_the_fused_path_and_its_gradients_equal_the_equation(shape, monkeypatch):
    """Output and every gradient equal the oracle's at 1e-10 (float64), twice bit for bit (the token gradients are
    added in one order); the tiles, on the same inputs, equal it too, so both routes are the one rule."""
    _small_groups(monkeypatch)
    m = model(**SHAPES[shape])
    attn = m.blocks[0].attn
    x = torch.randn(2, 45, BASE.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    q, k, v = (t.detach() for t in heads(attn, x))
    weight = torch.randn(2, 45, attn.n_head, attn.head_dim, dtype=torch.float64)
    maps = list(attn.adaptive_mu_q.parameters()) + list(attn.adaptive_mu_k.parameters())
    params = maps + (list(attn.rel_pos_bias.parameters()) if attn.rel_pos_bias is not None else [])
    want = _grads(attn, q, k, v, weight, params, oracle)
    with recorded() as taken:
        got = _grads(attn, q, k, v, weight, params, lambda a, *t: a.attend(*(z.clone() for z in t)))
        again = _grads(attn, q, k, v, weight, params, lambda a, *t: a.attend(*(z.clone() for z in t)))
    assert {p.name for p in taken} == {"fused"}
    with forced(**PLAIN), recorded() as tiled:
        tiles = _grads(attn, q, k, v, weight, params, lambda a, *t: a.attend(*(z.clone() for z in t)))
    assert {p.name for p in tiled} == {"tiles"}
    zero = [torch.zeros_like(p) for p in [q, k, v, *params]]
    for name, (out, grads) in {"fused": got, "tiles": tiles}.items():
        assert (out - want[0]).abs().max() < EXACT, name
        for g, w, z in zip(grads, want[1], zero):
            assert ((z if g is None else g) - (z if w is None else w)).abs().max() < EXACT, name
    assert torch.equal(got[0], again[0]) and all(torch.equal(a, b) for a, b in zip(got[1], again[1]) if a is not None)
    # the maps reach the output through the summaries; with select_only through the choice alone (no gradient)
    assert all(bool(g is None or g.abs().max() == 0) == ("only" in shape) for g in got[1][3 : 3 + len(maps)])


def test_bf16_on_the_fused_path_stays_near_the_equation():
    """bf16 q, k, v and weights: the kernel's parts in bf16 (the local blocks in fp32), the selected part and every
    merge in fp32. Against the oracle of the same bf16 numbers in float64: every (query, head) row within 1% of
    the output's scale but where bf16 rounding flipped a near-tie of the choice (at most 5% of rows; 1 of 90
    here), and gradients pointing the oracle's way (cosine above 0.99)."""
    m = model(**SHAPES["k2"])
    attn = m.blocks[0].attn.bfloat16()  # the adaptive maps too: the chunk state computed as a bf16 model does
    x = torch.randn(1, 45, BASE.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        q, k, v = (t.bfloat16() for t in heads(attn.double(), x))
    weight = torch.randn(1, 45, attn.n_head, attn.head_dim, dtype=torch.float64)
    want = _grads(attn, q.double(), k.double(), v.double(), weight, [], oracle)
    attn.bfloat16()
    with recorded() as taken:
        out, grads = _grads(attn, q, k, v, weight.bfloat16(), [], lambda a, *t: a.attend(*(z.clone() for z in t)))
    assert {p.name for p in taken} == {"fused"} and out.dtype == torch.bfloat16
    rows = (out.double() - want[0]).abs().amax(-1)  # (B, T, H)
    assert float((rows > 0.01 * want[0].abs().max()).double().mean()) <= 0.05
    for g, w in zip(grads, want[1]):
        assert torch.isfinite(g).all()
        assert float(torch.nn.functional.cosine_similarity(g.double().flatten(), w.flatten(), 0)) > 0.99


def test_selection_switched_off_on_the_fused_path_is_eva():
    """The same fused route without selection is EVA's own output, apart from the oracle: the selected part acts."""
    m = model(**SHAPES["k2"])
    attn = m.blocks[0].attn
    x = torch.randn(1, 45, BASE.d_model, dtype=torch.float64)
    with torch.no_grad():
        q, k, v = heads(attn, x)
        expected = oracle(attn, q, k, v)
        assert (attn.attend(q.clone(), k.clone(), v.clone()) - expected).abs().max() < EXACT
        attn.layout = dataclasses.replace(attn.layout, select=0)
        with recorded() as taken:
            eva = attn.attend(q.clone(), k.clone(), v.clone())
        assert {p.name for p in taken} == {"fused"} and (eva - expected).abs().max() > APART
