"""EVA's component ablations at evaluation time (`Ablation`, evalm/tiling.py; `--eva-ablation`).

    python -m pytest tests/evalm/test_eva_ablation.py -q

The oracle is EVA's equation written out here, float64: the chunk summaries of the closed form
(docs/eva.md), every local and remote logit scored densely, the terms the ablation removes masked,
one softmax. `no-remote` keeps the local block and no chunk; `chunk-window` keeps the keys of the
query's own chunk and every earlier chunk's summary. Each path (fused kernel, plain recompute,
tiles, the split softmax, forks, the cache in segments) must equal it, and must differ from the
oracle of EVA with nothing switched off (so an ignored switch fails).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from evalm import EvalmModel, ModelConfig
from evalm.eva import ablate
from evalm.tiling import Ablation
from tests import models
from tests.evalm.oracle import t5_bucket_ref
from tests.evalm.paths import PLAIN, TILES, forced, recorded

EXACT = 1e-10  # float64: sums reassociated, nothing else
APART = 1e-3  # an output the switch did not change would be this close to EVA's own
BASE = ModelConfig(vocab_size=61, d_model=32, n_layer=2, n_head=4, d_ff=64, window_size=8, chunk_size=4,
                   circular_period=64, dropout=0.0, attn_dropout=0.0, attention="eva")
SHAPES = {  # plain causal blocks (the kernel's own mask unless chunk-window), and T5 bias + overlap
    "plain": {},
    "overlap-t5-exclude": {"overlap_window": True, "use_t5_bias": True, "exclude_window_chunks": True},
}


def model(**changes) -> EvalmModel:
    """BASE with `changes`, every matrix drawn from N(0, 0.3²) (tests/models.py's reason), float64."""
    return models.visible_model(dataclasses.replace(BASE, **changes)).double().eval()


def heads(attn, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    B, T, _ = x.shape
    return tuple(p(x).view(B, T, attn.n_head, attn.head_dim) for p in (attn.q_proj, attn.k_proj, attn.v_proj))


def kept_terms(attn, T: int, ablation: Ablation) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, T) local and (T, C) remote visibility of EVA with `ablation`'s branch removed."""
    w, c, ext = attn.window_size, attn.chunk_size, attn.ext
    i, j, r = torch.arange(T)[:, None], torch.arange(T)[None], torch.arange(T // c)[None]
    block_start = (i // w * w - ext).clamp(min=0)
    lo = i // c * c if ablation is Ablation.CHUNK_WINDOW else block_start
    local = (j <= i) & (j >= lo)
    if ablation is Ablation.NO_REMOTE:
        remote = r < 0
    elif ablation is Ablation.CHUNK_WINDOW:
        remote = r < i // c  # every chunk before the query's own
    else:
        remote = r < (block_start // c if attn.exclude_window_chunks else i // c)
    return local, remote


def oracle(attn, q, k, v, ablation: Ablation) -> torch.Tensor:
    """EVA's closed form over exactly the kept terms: q, k, v (B, T, H, D) -> (B, T, H, D)."""
    B, T, H, D = q.shape
    c, s, C = attn.chunk_size, D**-0.5, T // attn.chunk_size
    qc, kc, vc = (x[:, : C * c].reshape(B, C, c, H, D) for x in (q, k, v))
    k_tilde = attn.adaptive_mu_k(kc.mean(2))  # (B, C, H, D)
    omega = attn.adaptive_mu_q(qc.mean(2)) + k_tilde
    lam = s * (kc * omega[:, :, None]).sum(-1) - s * kc.pow(2).sum(-1) / 2  # (B, C, c, H)
    beta = (torch.softmax(lam, 2)[..., None] * vc).sum(2)  # (B, C, H, D)
    local_logits = s * torch.einsum("bihd,bjhd->bhij", q, k)
    if attn.rel_pos_bias is not None:
        table = attn.rel_pos_bias.relative_attention_bias.weight[:, 0]
        span = attn.window_size + attn.ext
        bucket = [[t5_bucket_ref(max(0, i - j - attn.ext), len(table), span) for j in range(T)] for i in range(T)]
        local_logits = local_logits + s * table[torch.tensor(bucket)]
    remote_logits = s * torch.einsum("bihd,brhd->bhir", q, k_tilde)
    local, remote = kept_terms(attn, T, ablation)
    logits = torch.cat([local_logits.masked_fill(~local, float("-inf")), remote_logits.masked_fill(~remote, float("-inf"))], -1)
    values = torch.cat([v.transpose(1, 2), beta.transpose(1, 2)], -2)  # (B, H, T + C, D)
    return (torch.softmax(logits, -1) @ values).transpose(1, 2)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("ablation", [Ablation.NO_REMOTE, Ablation.CHUNK_WINDOW])
def test_every_one_shot_path_equals_the_equation_with_that_branch_removed(shape, ablation):
    m = model(**SHAPES[shape])
    attn = m.blocks[0].attn
    x = torch.randn(2, 45, BASE.d_model, dtype=torch.float64)  # 45: a padded last block
    with torch.no_grad():
        q, k, v = heads(attn, x)
        expected, intact = oracle(attn, q, k, v, ablation), oracle(attn, q, k, v, Ablation.NONE)
        assert (attn.attend(q, k, v) - intact).abs().max() < EXACT  # the oracle is EVA's own equation
        assert ablate(m, ablation) == BASE.n_layer
        names = set()
        for facts in ({}, PLAIN, TILES):
            for grad in (False, True):  # with a graph the tiles take one joint mask, without it the split softmax
                with forced(**facts), recorded() as taken, torch.set_grad_enabled(grad):
                    out = attn.attend(q.clone(), k.clone(), v.clone())
                assert (out - expected).abs().max() < EXACT, (taken[0].name, ablation)
                assert (out - intact).abs().max() > APART  # the switch acted
                names |= {p.name for p in taken}
    assert names == {"fused", "recompute", "tiles", "tiles-split"}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("ablation", [Ablation.NO_REMOTE, Ablation.CHUNK_WINDOW])
def test_the_cache_in_segments_and_forks_equals_the_ablated_one_shot_forward(shape, ablation):
    m = model(**SHAPES[shape])
    x = torch.randint(0, BASE.vocab_size, (2, 61), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        intact = m(x)
        ablate(m, ablation)
        whole = m(x)
        assert (whole - intact).abs().max() > APART
        with recorded() as taken:
            cache, parts = m.new_cache(batch_size=2), []
            for lo, hi in ((0, 3), (3, 11), (11, 12), (12, 30), (30, 61)):
                parts.append(m(x[:, lo:hi], cache=cache))
            trunk = m.new_cache()
            m(x[:1, :29], cache=trunk)
            tails = torch.randint(0, BASE.vocab_size, (3, 2), generator=torch.Generator().manual_seed(5))
            batched = m(tails, cache=trunk.fork(batch_size=3))
        assert (torch.cat(parts, 1) - whole).abs().max() < EXACT
        for b in range(3):
            alone = m(torch.cat([x[:1, :29], tails[b : b + 1]], 1))[:, 29:]
            assert (batched[b : b + 1] - alone).abs().max() < EXACT
    assert {"tiles-split", "forks-split"} <= {p.name for p in taken}


@pytest.mark.parametrize("shape", SHAPES)
def test_each_switch_changes_one_branch_of_the_rule(shape):
    """no-remote: the local keys of every query as EVA's, no chunk; chunk-window: the local keys cut
    to the query's chunk, every earlier chunk's summary (what the cut removed, in summary form)."""
    attn = model(**SHAPES[shape]).blocks[0].attn
    base, T, c = attn.layout, 80, BASE.chunk_size
    pos = torch.arange(T)
    cut = dataclasses.replace(base, ablation=Ablation.NO_REMOTE)
    assert torch.equal(cut.window_start(pos), base.window_start(pos)) and not cut.limit(pos).any()
    assert base.limit(pos).any()
    chunk = dataclasses.replace(base, ablation=Ablation.CHUNK_WINDOW)
    assert torch.equal(chunk.window_start(pos), pos // c * c) and torch.equal(chunk.limit(pos), pos // c)
    assert (base.window_start(pos) < pos // c * c).any()
    for t in (base, cut, chunk):  # the one-block mask the fused and plain paths read: the same rule
        mask = t.local_mask(None, "cpu", torch.float64)
        w, ext = t.window, t.ext
        for b in (1, 2):
            i = b * w + torch.arange(w)[:, None]
            j = b * w - ext + torch.arange(ext + w)[None]
            assert torch.equal(mask == 0, (j <= i) & (j >= t.window_start(i)))
    assert not chunk.plain_causal(None) and cut.plain_causal(None) == base.plain_causal(None)


def test_no_remote_is_the_window_only_attention_on_the_same_weights():
    """The recall study's control (attention = "window", evalm/window_attention.py) is EVA's local
    branch alone: EVA with no-remote gives the window model's output on the window model's weights."""
    eva, window = model(), model(attention="window")
    window.load_state_dict(eva.state_dict(), strict=False)  # all but A_q/A_k, which no-remote never reads
    x = torch.randint(0, BASE.vocab_size, (1, 50), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (eva(x) - window(x)).abs().max() > APART
        ablate(eva, "no-remote")
        assert (eva(x) - window(x)).abs().max() < EXACT


def test_a_model_without_eva_layers_reaches_none():
    assert ablate(model(attention="full"), Ablation.NO_REMOTE) == 0
    with pytest.raises(ValueError):
        Ablation("window")
