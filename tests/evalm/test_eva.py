"""EVA attention and the EVALM model against independent oracles (docs/eva.md, "Oracles": O1-O12).

Run: python -m pytest tests/evalm -q
Everything that claims exactness runs in float64 with dropout 0 in eval mode (no ε), so
the tolerances (1e-10) only absorb reassociation of float64 sums; a real bug moves outputs by
1e-3 or more.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from evalm import EvalmModel, ModelConfig
from evalm.eva import EvaAttention, t5_bucket
from evalm.full_attention import FullAttention
from tests.evalm.oracle import eva_per_token, t5_bucket_ref

EXACT = 1e-10  # float64: sums reassociated, nothing else

BASE = ModelConfig(
    vocab_size=61, d_model=32, n_layer=2, n_head=4, d_ff=64, window_size=16, chunk_size=4,
    circular_period=40, dropout=0.0, attn_dropout=0.0, attention="eva",
)


def make_model(**changes) -> EvalmModel:
    torch.manual_seed(0)
    model = EvalmModel(dataclasses.replace(BASE, **changes))
    model.init_weights()
    return model.double().eval()


def make_attention(**changes) -> EvaAttention:
    torch.manual_seed(1)
    attn = EvaAttention(dataclasses.replace(BASE, **changes))
    attn.init_weights()
    return attn.double().eval()


def tokens(n: int, batch: int = 1, seed: int = 2) -> torch.Tensor:
    return torch.randint(0, BASE.vocab_size, (batch, n), generator=torch.Generator().manual_seed(seed))


VARIANTS = {
    "w16c4": {},
    "w16c4-t5": {"use_t5_bias": True},
    "w8c4-t5": {"window_size": 8, "use_t5_bias": True},  # a span of 8: every in-window bucket exact
    "w8c4-overlap": {"window_size": 8, "overlap_window": True},
    "w8c4-overlap-t5": {"window_size": 8, "overlap_window": True, "use_t5_bias": True},
    "w16c16": {"chunk_size": 16},
    "w16c4-exclude": {"exclude_window_chunks": True},
    "w16c4-noln": {"adaptive_proj": "no-ln"},
}


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("n", [77, 64])
def test_o1_vectorised_equals_per_token_formula(name, n):
    attn = make_attention(**VARIANTS[name])
    x = torch.randn(2, n, BASE.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got = attn(x).numpy()
    np.testing.assert_allclose(got, eva_per_token(attn, x), rtol=0, atol=EXACT)


def test_t5_bucket_matches_scalar_definition():
    d = torch.arange(0, 300)
    ref = [t5_bucket_ref(int(i), 64, 128) for i in d]
    assert t5_bucket(d, 64, 128).tolist() == ref
    assert ref[:33] == list(range(32)) + [32] and ref[-1] == 63  # exact then log-spaced, capped


@pytest.mark.parametrize("name", ["w16c4-t5", "w8c4-overlap"])
def test_o2_prefix_invariance(name):
    model = make_model(**VARIANTS[name])
    x = tokens(77)
    with torch.no_grad():
        full = model(x)
        for length in (1, 3, 4, 15, 16, 17, 33, 50, 76):
            torch.testing.assert_close(model(x[:, :length]), full[:, :length], rtol=0, atol=EXACT)


SPLITS = [[77], [1] * 77, [5, 13, 1, 30, 28], [16, 16, 16, 29], [3, 61, 13]]


@pytest.mark.parametrize("attention", ["eva", "full"])
@pytest.mark.parametrize("name", ["w16c4-t5", "w8c4-t5", "w8c4-overlap-t5", "w16c4-exclude"])
def test_o3_incremental_equals_one_shot(attention, name):
    model = make_model(attention=attention, **VARIANTS[name])
    x = tokens(77, batch=2)
    with torch.no_grad():
        expected = model(x)
        for split in SPLITS:
            cache, outs, at = model.new_cache(batch_size=2), [], 0
            for length in split:
                outs.append(model(x[:, at : at + length], cache=cache))
                at += length
            assert cache.n_seen == 77
            torch.testing.assert_close(torch.cat(outs, 1), expected, rtol=0, atol=EXACT, msg=str(split))


@pytest.mark.parametrize("attention", ["eva", "full"])
def test_o4_forks_equal_one_shot_and_leave_parent_untouched(attention):
    model = make_model(attention=attention, use_t5_bias=True)
    demo, tests = tokens(50, seed=4), [tokens(9, seed=10 + i) for i in range(3)]
    with torch.no_grad():
        parent = model.new_cache()
        model(demo, cache=parent)
        for test in tests:
            child = parent.fork()
            got = model(test, cache=child)
            want = model(torch.cat([demo, test], 1))[:, 50:]
            torch.testing.assert_close(got, want, rtol=0, atol=EXACT)
            assert parent.n_seen == 50 and child.n_seen == 59
        # nested fork: share the encoded test input, then fork again per candidate
        child = parent.fork()
        model(tests[0], cache=child)
        for cand in tests[1:]:
            got = model(cand, cache=child.fork())
            want = model(torch.cat([demo, tests[0], cand], 1))[:, 59:]
            torch.testing.assert_close(got, want, rtol=0, atol=EXACT)
        # the parent still continues exactly as if no child had existed
        tail = tokens(30, seed=20)
        torch.testing.assert_close(model(tail, cache=parent), model(torch.cat([demo, tail], 1))[:, 50:], rtol=0, atol=EXACT)


def _full_like(attn: EvaAttention) -> FullAttention:
    full = FullAttention(dataclasses.replace(BASE, attention="full")).double().eval()
    own = {k: v for k, v in attn.state_dict().items() if k.split(".")[0] in ("q_proj", "k_proj", "v_proj", "out_proj")}
    full.load_state_dict(own, strict=True)
    return full


def test_o5_no_visible_chunk_is_exact_softmax():
    # c ≥ n: no chunk completes (the reference crashes here); w = c = 16, n = 10 and 16
    attn = make_attention(chunk_size=16)
    for n in (10, 16):
        x = torch.randn(1, n, BASE.d_model, dtype=torch.float64)
        with torch.no_grad():
            torch.testing.assert_close(attn(x), _full_like(attn)(x), rtol=0, atol=EXACT)
    # queries in chunk 0 see no remote entry, so they equal softmax even when later chunks exist
    attn = make_attention(window_size=64, chunk_size=8)
    x = torch.randn(1, 64, BASE.d_model, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(attn(x)[:, :8], _full_like(attn)(x)[:, :8], rtol=0, atol=EXACT)


def test_o6_window_covering_everything_is_softmax_only_with_exclusion():
    x = torch.randn(1, 64, BASE.d_model, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        excl = make_attention(window_size=64, chunk_size=8, exclude_window_chunks=True)
        torch.testing.assert_close(excl(x), _full_like(excl)(x), rtol=0, atol=EXACT)
        legacy = make_attention(window_size=64, chunk_size=8)  # 2023 semantics: double counting
        assert (legacy(x) - _full_like(legacy)(x)).abs().max() > 1e-3


def test_o8_remote_value_is_convex_combination():
    attn = make_attention()
    q = torch.randn(2, 4, 3, 4, 8, dtype=torch.float64)
    k = torch.randn(2, 4, 3, 4, 8, dtype=torch.float64) * 5
    u = torch.randn(2, 4, 3, 1, 8, dtype=torch.float64)
    with torch.no_grad():
        _, beta = attn.summarize(q, k, u.expand(-1, -1, -1, 4, -1))
    torch.testing.assert_close(beta, u.squeeze(-2), rtol=0, atol=EXACT)


@pytest.mark.parametrize("overlap", [False, True])
def test_o9_cache_holds_window_pending_and_one_summary_per_chunk(overlap):
    model = make_model(window_size=8, overlap_window=overlap)
    w, c, ext = 8, 4, 8 if overlap else 0
    cache = model.new_cache()
    with torch.no_grad():
        for n in range(1, 120):
            model(tokens(1, seed=n), cache=cache)
            for state in cache.layers:
                assert sum(p.shape[-2] for p in state.remote_k) == n // c
                assert state.local_k.shape[-2] == n - max(0, (n // w) * w - ext) <= ext + w
                assert state.pending_q.shape[-2] == n - (n // c) * c < c
    full = make_model(attention="full").new_cache()
    with torch.no_grad():
        make_model(attention="full")(tokens(119), cache=full)
    assert cache.nbytes() < full.nbytes() / 2  # ⌊n/c⌋ entries + window vs n entries


def test_o10_circular_rows_wrap_and_continue_from_cache():
    from evalm.positions import CircularPositionalEmbedding, circular_positions

    assert circular_positions(37, 6, 40).tolist() == [37, 38, 39, 0, 1, 2]
    emb = CircularPositionalEmbedding(5, 3)
    torch.nn.init.normal_(emb.weight)  # the module leaves its table to init_weights: torch.empty may hold NaN
    torch.testing.assert_close(emb(3, 4), emb.weight[[3, 4, 0, 1]], rtol=0, atol=0)
    # T = 100 > M = 40 rows: the one-shot forward wraps twice; the cache continues the same rows
    model = make_model()
    x = tokens(100)
    with torch.no_grad():
        cache = model.new_cache()
        parts = [model(x[:, :37], cache=cache), model(x[:, 37:], cache=cache)]
        torch.testing.assert_close(torch.cat(parts, 1), model(x), rtol=0, atol=EXACT)
    # the rows the model reads when it continues a cache at position 37 wrap at M = 40
    seen = []
    model.embed_positions.register_forward_hook(lambda mod, args, out: seen.append(out))
    with torch.no_grad():
        cache = model.new_cache(position_offset=37)
        model(x[:, :6], cache=cache)
    torch.testing.assert_close(seen[-1], model.embed_positions.weight[[37, 38, 39, 0, 1, 2]], rtol=0, atol=0)


@pytest.mark.parametrize("attention", ["eva", "full"])
def test_o11_batched_right_padded_forks_equal_single_forks(attention):
    model = make_model(attention=attention, use_t5_bias=True)
    demo = tokens(45, seed=6)
    tests = [tokens(n, seed=30 + n)[0] for n in (3, 11, 7, 1)]
    with torch.no_grad():
        parent = model.new_cache()
        model(demo, cache=parent)
        batch = torch.zeros(len(tests), 11, dtype=torch.long)
        for i, t in enumerate(tests):
            batch[i, : len(t)] = t
        got = model(batch, cache=parent.fork(batch_size=len(tests)))
        for i, t in enumerate(tests):
            one = model(t[None], cache=parent.fork())
            torch.testing.assert_close(got[i, : len(t)], one[0], rtol=0, atol=EXACT)
    assert parent.n_seen == 45


def test_o12_training_noise_is_fresh_each_forward_and_absent_in_eval():
    model = make_model()
    x = tokens(40)
    model.train()
    assert (model(x) - model(x)).abs().max() > 1e-6
    model.eval()
    torch.testing.assert_close(model(x), model(x), rtol=0, atol=0)


def test_merge_of_one_group_equals_concatenation():
    """Structured Prompting with M = 1 is plain concatenation (group length a multiple of w)."""
    for attention in ("eva", "full"):
        model = make_model(attention=attention)
        from evalm.cache import merge

        group, test = tokens(32, seed=7), tokens(13, seed=8)
        with torch.no_grad():
            cache = model.new_cache()
            model(group, cache=cache)
            got = model(test, cache=merge([cache], own_logit_bias=0.0))
            torch.testing.assert_close(got, model(torch.cat([group, test], 1))[:, 32:], rtol=0, atol=EXACT)


def test_state_dict_uses_reference_parameter_names():
    attn = EvaAttention(dataclasses.replace(BASE, use_t5_bias=True))
    names = {f"{m}.{p}" for m in ("q_proj", "k_proj", "v_proj", "out_proj") for p in ("weight", "bias")}
    names |= {f"adaptive_mu_{a}.{i}.{p}" for a in "qk" for i in "01" for p in ("weight", "bias")}
    names |= {"rel_pos_bias.relative_attention_bias.weight"}
    assert set(attn.state_dict()) == names


def test_meta_construction_then_init_weights():
    with torch.device("meta"):
        model = EvalmModel(BASE)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.init_weights()
    assert model.lm_head.weight is model.embed_tokens.weight
    assert torch.isfinite(model(tokens(20))).all()
    again = EvalmModel(BASE)
    torch.manual_seed(0)
    again.init_weights()
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_absolute_positions_equal_circular_inside_the_table_and_repeat_the_last_row_after():
    from evalm.positions import absolute_positions, circular_positions

    assert absolute_positions(250, 10, 256).tolist() == [250, 251, 252, 253, 254, 255, 255, 255, 255, 255]
    assert circular_positions(250, 10, 256).tolist() == [250, 251, 252, 253, 254, 255, 0, 1, 2, 3]
    cfg = dict(vocab_size=50, d_model=32, n_layer=1, n_head=4, d_ff=64, window_size=8, chunk_size=4,
               circular_period=16, dropout=0.0, attn_dropout=0.0)
    torch.manual_seed(0)
    circ = EvalmModel(ModelConfig(**cfg))
    circ.init_weights()
    absolute = EvalmModel(ModelConfig(**cfg, positions="absolute"))
    absolute.load_state_dict(circ.state_dict())  # the same weights: only the row rule differs
    tokens = torch.randint(0, 50, (1, 40))
    with torch.no_grad():
        a, c = absolute.eval()(tokens), circ.eval()(tokens)
    assert torch.equal(a[:, :16], c[:, :16])  # positions < M: the same rows
    assert (a[:, 16:] - c[:, 16:]).abs().max() > 1e-4  # past M the rules differ (the oracle can fail)
