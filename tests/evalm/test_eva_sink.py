"""EVA with sink tokens (`sink_tokens`, evalm/tiling.py): the first S tokens stay exact keys of every
later query and their chunks have no summary.

    python -m pytest tests/evalm/test_eva_sink.py -q

The oracle is the rule written out here in float64: every local, sink and remote logit scored
densely, the invisible ones masked, one softmax. Every path must equal it (a whole sequence, with
and without a graph; the cache in segments that cut through the sink; forks), its gradients
must equal the oracle's, and it must differ from EVA without a sink on the same weights (so a
sink that is read nowhere fails).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from evalm import EvalmModel, ModelConfig, dropout_mask, summaries
from evalm.cache import merge
from evalm.config_toolkit import ConfigError, build
from evalm.eva import ablate
from evalm.tiling import Ablation
from tests import models
from tests.evalm.oracle import t5_bucket_ref
from tests.evalm.paths import PLAIN, TILES, forced, recorded

EXACT = 1e-10  # float64: sums reassociated, nothing else
APART = 1e-3  # an output the sink did not change would be this close to EVA's own
BASE = ModelConfig(vocab_size=61, d_model=32, n_layer=2, n_head=4, d_ff=64, window_size=8, chunk_size=4,
                   circular_period=64, dropout=0.0, attn_dropout=0.0, attention="eva")
SHAPES = {  # S below and above the block w = 8; plain blocks, and overlap + T5 bias + excluded window chunks
    "plain-4": {"sink_tokens": 4},
    "plain-12": {"sink_tokens": 12},
    "overlap-t5-exclude-4": {"sink_tokens": 4, "overlap_window": True, "use_t5_bias": True, "exclude_window_chunks": True},
    "overlap-t5-exclude-12": {"sink_tokens": 12, "overlap_window": True, "use_t5_bias": True, "exclude_window_chunks": True},
}


def model(**changes) -> EvalmModel:
    """BASE with `changes`, every matrix drawn from N(0, 0.3²) (tests/models.py's reason), float64."""
    return models.visible_model(dataclasses.replace(BASE, **changes)).double().eval()


def heads(attn, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    B, T, _ = x.shape
    return tuple(p(x).view(B, T, attn.n_head, attn.head_dim) for p in (attn.q_proj, attn.k_proj, attn.v_proj))


def visibility(attn, T: int, sink: int, ablation: Ablation = Ablation.NONE) -> tuple[torch.Tensor, ...]:
    """(T, T) local, (T, T) sink and (T, C) remote visibility of EVA with `sink` sink tokens."""
    w, c, ext = attn.window_size, attn.chunk_size, attn.ext
    i, j, r = torch.arange(T)[:, None], torch.arange(T)[None], torch.arange(T // c)[None]
    start = i // c * c if ablation is Ablation.CHUNK_WINDOW else (i // w * w - ext).clamp(min=0)
    local = (j <= i) & (j >= start)
    sunk = j < torch.minimum(start, torch.tensor(sink))
    limit = start // c if attn.exclude_window_chunks else i // c
    remote = (r >= sink // c) & (r < limit) & (ablation is not Ablation.NO_REMOTE)
    return local, sunk, remote


def oracle(attn, q, k, v, sink: int, ablation: Ablation = Ablation.NONE, move=None, training=None) -> torch.Tensor:
    """EVA's closed form with sink tokens: q, k, v (B, T, H, D) -> (B, T, H, D). `move(keys, shift)`:
    the sink keys a query reads are move(k_j, window_start(its block's start) − S). `training` (dropout
    seed, rate, noise seed[, a tensor like the route's ω: where and in which dtype ε is drawn, the CPU
    in q's dtype by default]): ε of the summarised chunks drawn as evalm/summaries.py draws it, and each
    probability times the keep decision of evalm/dropout_mask.py (token keys by position, local or
    sink; chunk r as −1 − r), scaled by 1/(1 − p)."""
    B, T, H, D = q.shape
    c, s, C = attn.chunk_size, D**-0.5, T // attn.chunk_size
    qc, kc, vc = (x[:, : C * c].reshape(B, C, c, H, D) for x in (q, k, v))
    k_tilde = attn.adaptive_mu_k(kc.mean(2))  # (B, C, H, D)
    omega = attn.adaptive_mu_q(qc.mean(2)) + k_tilde
    first = sink // c
    if training is not None:  # one draw for the chunks the call summarises, laid out (B, H, chunks, D)
        like = training[3] if len(training) > 3 else torch.empty((), dtype=q.dtype)
        eps = summaries.noise(training[2], like.new_empty(B, H, C - first, D)).to(q).transpose(1, 2)
        omega = torch.cat([omega[:, :first], omega[:, first:] + eps], 1)
    lam = s * (kc * omega[:, :, None]).sum(-1) - s * kc.pow(2).sum(-1) / 2  # (B, C, c, H)
    beta = (torch.softmax(lam, 2)[..., None] * vc).sum(2)  # (B, C, H, D)
    token_logits = s * torch.einsum("bihd,bjhd->bhij", q, k)
    local_logits = token_logits
    if attn.rel_pos_bias is not None:  # the T5 bias is the local block's; sink keys have none
        table = attn.rel_pos_bias.relative_attention_bias.weight[:, 0]
        span = attn.window_size + attn.ext
        bucket = [[t5_bucket_ref(max(0, i - j - attn.ext), len(table), span) for j in range(T)] for i in range(T)]
        local_logits = local_logits + s * table[torch.tensor(bucket)]
    remote_logits = s * torch.einsum("bihd,brhd->bhir", q, k_tilde)
    local, sunk, remote = visibility(attn, T, sink, ablation)
    sink_logits = token_logits
    if move is not None:
        w, ext = attn.window_size, attn.ext
        block = torch.arange(T) // w * w  # the query's block start, and that block's window start
        start = block if ablation is Ablation.CHUNK_WINDOW else (block - ext).clamp(min=0)
        shift = start - sink  # (T,) per query
        moved = move(k[:, None], shift.view(1, T, 1, 1))  # (B, T queries, T keys, H, D)
        sink_logits = s * torch.einsum("bihd,bijhd->bhij", q, moved)
    logits = torch.cat([local_logits.masked_fill(~local, float("-inf")), sink_logits.masked_fill(~sunk, float("-inf")),
                        remote_logits.masked_fill(~remote, float("-inf"))], -1)
    values = torch.cat([v.transpose(1, 2), v.transpose(1, 2), beta.transpose(1, 2)], -2)  # (B, H, 2T + C, D)
    p = torch.softmax(logits, -1)
    if training is not None:
        seed, rate = training[:2]
        ids = torch.cat([torch.arange(T), torch.arange(T), dropout_mask.chunk_key(torch.arange(C))])
        kept = dropout_mask.keep(seed, rate, torch.arange(B).view(B, 1, 1, 1), torch.arange(H).view(1, H, 1, 1),
                                 torch.arange(T).view(1, 1, T, 1), ids.view(1, 1, 1, -1))
        p = p * kept / (1 - rate)
    return (p @ values).transpose(1, 2)


@pytest.mark.parametrize("shape", SHAPES)
def test_every_whole_sequence_path_equals_the_equation_with_sink_tokens(shape):
    m = model(**SHAPES[shape])
    attn, S = m.blocks[0].attn, SHAPES[shape]["sink_tokens"]
    x = torch.randn(2, 45, BASE.d_model, dtype=torch.float64)  # 45: a padded last block
    with torch.no_grad():
        q, k, v = heads(attn, x)
        expected, without = oracle(attn, q, k, v, S), oracle(attn, q, k, v, 0)
    assert (expected - without).abs().max() > APART  # the sink changes the equation
    names = set()
    for facts in ({}, PLAIN, TILES):
        for grad in (False, True):  # with a graph one joint mask per tile group, without it the split softmax
            with forced(**facts), recorded() as taken, torch.set_grad_enabled(grad):
                out = attn.attend(q.clone(), k.clone(), v.clone())
            assert (out - expected).abs().max() < EXACT, taken[0].name
            names |= {p.name for p in taken}
    assert names == {"tiles", "tiles-split"}  # the fused and plain paths do not read sink tokens: never taken


def move(keys: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """A stand-in for a rotary host's move of sink keys (evalm/hf_llama.py): any function of the key and
    the shift serves the equation; this one is a rotation of each (even, odd) pair by 0.05·shift."""
    angle = 0.05 * shift.to(keys.dtype).unsqueeze(-1)
    even, odd = keys[..., 0::2], keys[..., 1::2]
    return torch.stack([even * angle.cos() - odd * angle.sin(), even * angle.sin() + odd * angle.cos()], -1).flatten(-2)


@pytest.mark.parametrize("shape", ["plain-12", "overlap-t5-exclude-4"])
def test_sink_keys_moved_before_each_block_equal_the_equation_on_every_path(shape):
    """With `sink_shift` (what a RoPE host sets) each block reads the sink keys moved by its own shift:
    whole sequences (several blocks per tile, several tiles per group), the cache in segments, forks."""
    m = model(**SHAPES[shape])
    S = SHAPES[shape]["sink_tokens"]
    for block in m.blocks:
        block.attn.sink_shift = move
    attn = m.blocks[0].attn
    x = torch.randn(2, 45, BASE.d_model, dtype=torch.float64)
    with torch.no_grad():
        q, k, v = heads(attn, x)
        expected = oracle(attn, q, k, v, S, move=move)
        assert (expected - oracle(attn, q, k, v, S)).abs().max() > APART  # the move changes the equation
        for grad in (False, True):
            with torch.set_grad_enabled(grad):
                assert (attn.attend(q.clone(), k.clone(), v.clone()) - expected).abs().max() < EXACT
        attn.query_tile = 8  # one block per tile, many tiles per group
        assert (attn.attend(q.clone(), k.clone(), v.clone()) - expected).abs().max() < EXACT
        check_cache_matches_whole(m)


def check_cache_matches_whole(m: EvalmModel) -> None:
    """The model `m` read through its cache in segments cutting blocks, chunks and the sink equals the whole
    sequence, and a batch of three forks of one parent scoring two tokens each equals each sequence alone."""
    tokens = torch.randint(0, BASE.vocab_size, (2, 61), generator=torch.Generator().manual_seed(1))
    whole = m(tokens)
    cache, parts = m.new_cache(batch_size=2), []
    for lo, hi in ((0, 3), (3, 11), (11, 30), (30, 61)):
        parts.append(m(tokens[:, lo:hi], cache=cache))
    assert (torch.cat(parts, 1) - whole).abs().max() < EXACT
    trunk = m.new_cache()
    m(tokens[:1, :29], cache=trunk)
    tails = torch.randint(0, BASE.vocab_size, (3, 2), generator=torch.Generator().manual_seed(5))
    batched = m(tails, cache=trunk.fork(batch_size=3))
    for b in range(3):
        assert (batched[b : b + 1] - m(torch.cat([tokens[:1, :29], tails[b : b + 1]], 1))[:, 29:]).abs().max() < EXACT


@pytest.mark.parametrize("shape", ["plain-12", "overlap-t5-exclude-4"])
def test_in_training_the_sink_takes_the_dropout_and_noise_every_path_draws(shape):
    """Attention dropout and the summaries' noise ε in training, replayed by the oracle from the seeds
    the layer draws from torch's RNG (dropout's, then ε's); sink keys are dropped by their position."""
    m = model(**SHAPES[shape], attn_dropout=0.3)
    attn, S = m.blocks[0].attn, SHAPES[shape]["sink_tokens"]
    check_training_draws(attn, lambda q, k, v, training: oracle(attn, q, k, v, S, training=training))


def check_training_draws(attn, reference) -> None:
    """`attn` in training (attention dropout 0.3) equals `reference(q, k, v, training)` given the seeds the layer
    draws from torch's RNG, dropout's then ε's (`EvaAttention._tiling`'s order), and differs from it under
    another dropout seed."""
    attn.train()
    x = torch.randn(2, 45, BASE.d_model, dtype=torch.float64)
    with torch.no_grad():
        q, k, v = heads(attn, x)
        torch.manual_seed(7)
        out = attn.attend(q.clone(), k.clone(), v.clone())
        torch.manual_seed(7)
        seeds = [int(torch.randint(0, 2**62, (1,))) for _ in range(2)]
        assert (out - reference(q, k, v, (seeds[0], 0.3, seeds[1]))).abs().max() < EXACT
        assert (out - reference(q, k, v, (seeds[0] + 1, 0.3, seeds[1]))).abs().max() > APART


@pytest.mark.parametrize("shape", ["plain-12", "overlap-t5-exclude-4"])
def test_gradients_with_sink_tokens_equal_the_equations(shape):
    """Uptraining with a sink runs the tiles under autograd: d q, d k, d v and A_q/A_k's gradients are
    those of the oracle."""
    m = model(**SHAPES[shape])
    attn, S = m.blocks[0].attn, SHAPES[shape]["sink_tokens"]
    x = torch.randn(1, 37, BASE.d_model, dtype=torch.float64)
    q, k, v = (t.detach().requires_grad_() for t in heads(attn, x))
    weight = torch.randn(1, 37, attn.n_head, attn.head_dim, dtype=torch.float64)
    params = list(attn.adaptive_mu_q.parameters()) + list(attn.adaptive_mu_k.parameters())
    got = torch.autograd.grad((attn.attend(q.clone(), k.clone(), v.clone()) * weight).sum(), [q, k, v, *params])
    want = torch.autograd.grad((oracle(attn, q, k, v, S) * weight).sum(), [q, k, v, *params])
    for g, o in zip(got, want):
        assert (g - o).abs().max() < 1e-9
    assert (want[1][:, :S] - torch.autograd.grad((oracle(attn, q, k, v, 0) * weight).sum(), k)[0][:, :S]).abs().max() > APART


@pytest.mark.parametrize("shape", ["plain-4", "plain-12", "overlap-t5-exclude-12"])
def test_the_cache_in_segments_and_forks_equal_the_one_shot_forward(shape):
    """Segments that end inside the sink (3), at its chunk edge (12) and past it; forks of a parent whose
    sink is complete (its sink shared, the forks path) and of one whose sink is still filling."""
    m = model(**SHAPES[shape])
    x = torch.randint(0, BASE.vocab_size, (2, 61), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = m(x)
        assert (whole - model(**{**SHAPES[shape], "sink_tokens": 0})(x)).abs().max() > APART
        with recorded() as taken:
            cache, parts = m.new_cache(batch_size=2), []
            for lo, hi in ((0, 3), (3, 11), (11, 12), (12, 30), (30, 61)):
                parts.append(m(x[:, lo:hi], cache=cache))
        assert (torch.cat(parts, 1) - whole).abs().max() < EXACT
        tails = torch.randint(0, BASE.vocab_size, (3, 2), generator=torch.Generator().manual_seed(5))
        for trunk_len in (29, 2):
            trunk = m.new_cache()
            m(x[:1, :trunk_len], cache=trunk)
            with recorded() as forked:
                batched = m(tails, cache=trunk.fork(batch_size=3))
            for b in range(3):
                alone = m(torch.cat([x[:1, :trunk_len], tails[b : b + 1]], 1))[:, trunk_len:]
                assert (batched[b : b + 1] - alone).abs().max() < EXACT
            assert ("forks-split" in {p.name for p in forked}) == (trunk_len >= SHAPES[shape]["sink_tokens"])
    assert "tiles-split" in {p.name for p in taken}


def test_a_cache_offers_its_sink_summaries_and_window_once_to_a_merge():
    """`entries()` (what Structured Prompting merges and SAICL reads): the sink tokens before the window,
    the summaries from chunk S/c on, the window rows; no token twice. Two groups merged read them all."""
    m = model(sink_tokens=8)
    x = torch.randint(0, BASE.vocab_size, (1, 27), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        cache = m.new_cache()
        m(x, cache=cache)
        state = cache.layers[0]
        keys, _ = state.entries()
        assert keys.shape[-2] == 8 + (27 // 4 - 2) + (27 - 24)  # 8 sink, chunks 2 … 5, window rows 24 … 26
        assert torch.equal(keys[..., :8, :], state.sink_k) and torch.equal(keys[..., -3:, :], state.local_k)
        early = m.new_cache()
        m(x[:, :5], cache=early)  # the window still holds every sink token: none offered twice
        assert early.layers[0].entries()[0].shape[-2] == 5 + 0
        other = m.new_cache()
        m(x[:, :13], cache=other)
        merged = merge([cache, other])
        assert merged.prefix[0][0].shape[-2] == keys.shape[-2] + other.layers[0].entries()[0].shape[-2]
        out = m(x[:, :3], cache=merged)
        assert torch.isfinite(out).all()


def test_the_window_alone_with_sink_tokens_is_the_exact_softmax_over_window_and_sink():
    """no-remote with a sink: exact attention over the local keys and the first S tokens, nothing else
    (the conversion study's masked oracle, evalm's side)."""
    m = model(sink_tokens=8, overlap_window=True)
    attn = m.blocks[0].attn
    x = torch.randn(1, 40, BASE.d_model, dtype=torch.float64)
    with torch.no_grad():
        q, k, v = heads(attn, x)
        ablate(m, Ablation.NO_REMOTE)
        out = attn.attend(q, k, v)
        T, s = 40, attn.head_dim**-0.5
        i, j = torch.arange(T)[:, None], torch.arange(T)[None]
        seen = (j <= i) & ((j >= (i // 8 * 8 - 8).clamp(min=0)) | (j < 8))
        logits = (s * torch.einsum("bihd,bjhd->bhij", q, k)).masked_fill(~seen, float("-inf"))
        want = (torch.softmax(logits, -1) @ v.transpose(1, 2)).transpose(1, 2)
    assert (out - want).abs().max() < EXACT
    assert (out - oracle(attn, q, k, v, 0, Ablation.NO_REMOTE)).abs().max() > APART


@pytest.mark.parametrize("changes, words", [({"sink_tokens": 6}, "multiple of chunk_size=4"),
                                            ({"sink_tokens": -4}, "multiple of chunk_size=4"),
                                            ({"sink_tokens": 4, "attention": "full"}, "is EVA's")])
def test_a_sink_that_cannot_replace_whole_chunks_is_refused(changes, words):
    """As a `[model]` section (a config file, an HF config.json's `evalm` section) is read: one line."""
    section = {**dataclasses.asdict(BASE), **changes}
    with pytest.raises(ConfigError, match=words):
        build(ModelConfig, section, where="model.toml [model]")
