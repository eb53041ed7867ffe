"""The GPU route's own autograd, on the CPU (evalm/flex.py): flex_attention's kernel replaced by a dense,
differentiable one with its documented semantics (`score_mod` on every score, `mask_mod` on every slot, a
softmax, ℓ), so what the route composes around the kernel is differentiated here in float64 against the
equation (tests/evalm/test_eva_sink.py's oracle): the slots' summaries, the lengths padded to a bucket, the
T5 bias as a captured tensor, moved sink copies, ε of the real chunks only, and attention dropout's two
calls joined by their log-sum-exps. On a GPU the kernel is inductor's (tests/evalm/test_flex_cuda.py).

    python -m pytest tests/evalm/test_flex_grad.py -q
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from evalm import flex
from tests.evalm.test_eva_sink import BASE, heads, model, move, oracle
from tests.evalm.test_flex import VARIANTS

EXACT = 1e-10  # float64: sums reassociated, nothing else


def dense_kernel(q, k, v, score_mod=None, block_mask=None, scale=None, return_lse=False, return_aux=None):
    """flex_attention's contract, written out densely with autograd: q (B, H, n, D), k and v (B, H, L, D)."""
    B, H, n, _ = q.shape
    b, h = torch.arange(B).view(B, 1, 1, 1), torch.arange(H).view(1, H, 1, 1)
    i, j = torch.arange(n).view(1, 1, n, 1), torch.arange(k.shape[2]).view(1, 1, 1, -1)
    scores = (q @ k.transpose(-1, -2)) * scale
    if score_mod is not None:
        scores = score_mod(scores, b, h, i, j)
    scores = scores.masked_fill(~block_mask.mask_mod(b, h, i, j), float("-inf"))
    lse = torch.logsumexp(scores, -1)
    # a row that keeps no key: ℓ = −inf and output 0, with no NaN in forward or backward
    shifted = torch.where(torch.isfinite(lse).unsqueeze(-1), scores - lse.unsqueeze(-1), float("-inf"))
    out = shifted.exp() @ v
    if return_aux is not None:
        return out, SimpleNamespace(lse=lse)
    return (out, lse) if return_lse else out


def grads(attn, out, q, k, v, weight) -> list[torch.Tensor]:
    params = [*attn.adaptive_mu_q.parameters(), *attn.adaptive_mu_k.parameters(),
              *(attn.rel_pos_bias.parameters() if attn.rel_pos_bias is not None else ())]
    return list(torch.autograd.grad((out * weight).sum(), [q, k, v, *params]))


@pytest.mark.parametrize("n", [45, 300])  # padded to 128 and 384 (a bucket), each a last chunk cut short
@pytest.mark.parametrize("variant", ["overlap-t5-exclude", "sink-12-moved", "overlap-t5-exclude-sink-4-moved"])
@pytest.mark.parametrize("training", [False, True])
def test_the_routes_gradients_equal_the_equations(variant, n, training):
    changes = dict(VARIANTS[variant])
    moved = changes.pop("moved", False)
    m = model(**changes, attn_dropout=0.3 if training else 0.0)
    attn, S = m.blocks[0].attn, changes.get("sink_tokens", 0)
    attn.sink_shift = move if moved else None
    attn.train(training)
    x = torch.randn(2, n, BASE.d_model, dtype=torch.float64)
    weight = torch.randn(2, n, attn.n_head, attn.head_dim, dtype=torch.float64)
    with torch.no_grad():
        q, k, v = heads(attn, x)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    torch.manual_seed(7)
    t = attn._tiling()  # this forward's rule and seeds, as the layer draws them
    parts = flex.LayerParts(t, attn.maps, attn.rel_pos_bias, attn.sink_shift)
    got = flex.attend_layer(parts, q, k, v, kernel=dense_kernel)
    got_grads = grads(attn, got, q, k, v, weight)
    want = oracle(attn, q, k, v, S, move=move if moved else None,
                  training=(t.seed, 0.3, t.noise_seed) if training else None)
    want_grads = grads(attn, want, q, k, v, weight)
    assert got.shape == q.shape and (got - want).abs().max() < EXACT
    errors = [((g - w).abs().max() / w.abs().max()).item() for g, w in zip(got_grads, want_grads)]
    assert max(errors) < EXACT, errors
