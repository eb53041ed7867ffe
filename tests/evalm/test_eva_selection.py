"""Selection inside EVA's memory (`select_chunks`, evalm/selection.py): each query reads exactly the tokens of
the k chunks its summaries score highest, in place of those summaries.

    python -m pytest tests/evalm/test_eva_selection.py -q

The oracle is the rule written out here in float64: every local, sink, remote and token logit scored
densely, each query's choice made by a Python sort over its own candidates (ties to the earlier chunk, a
group's heads summed), one softmax over what it may see. Every route must equal it (a whole sequence with
and without a graph; the cache in segments; forks over a shared parent; training with dropout and noise;
gradients), and it must differ from EVA without selection on the same weights, so a selection that is
read nowhere fails.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from evalm import EvalmModel, ModelConfig, dropout_mask, selection, summaries
from evalm.config_toolkit import ConfigError, build
from evalm.eva import ablate
from evalm.eva_settings import EvaSettings
from evalm.tiling import Ablation
from tests import models
from tests.evalm.oracle import t5_bucket_ref
from tests.evalm.paths import PLAIN, SELECTION_KERNEL, TILES, forced, recorded
from tests.evalm.test_eva_sink import BASE, check_cache_matches_whole, check_training_draws, heads, move

EXACT = 1e-10  # float64: sums reassociated, nothing else
APART = 1e-3  # an output selection did not change would be this close to EVA's own
SHAPES = {  # window 8, chunk 4: from token 16 on a query has candidates before its window
    "k1": {"select_chunks": 1},
    "k2": {"select_chunks": 2},
    "k3-only": {"select_chunks": 3, "select_only": True},
    "k2-overlap-t5-exclude": {"select_chunks": 2, "overlap_window": True, "use_t5_bias": True,
                              "exclude_window_chunks": True},
    "k2-sink": {"select_chunks": 2, "sink_tokens": 4},
    "k2-only-sink-overlap": {"select_chunks": 2, "select_only": True, "sink_tokens": 8, "overlap_window": True},
    "k2-bound": {"select_chunks": 2, "select_by": "bound"},
    "k1-bound-only-sink-t5": {"select_chunks": 1, "select_by": "bound", "select_only": True, "sink_tokens": 4, "overlap_window": True,
                              "use_t5_bias": True},
}


def model(**changes) -> EvalmModel:
    """BASE with `changes`, every matrix drawn from N(0, 0.3²) (tests/models.py's reason), float64."""
    return models.visible_model(dataclasses.replace(BASE, **changes)).double().eval()


def oracle(attn, q, k, v, group: int = 1, ablation: Ablation = Ablation.NONE, training=None, move=None) -> torch.Tensor:
    """EVA with selection, q, k, v (B, T, H, D) -> (B, T, H, D), from the module's settings (window, chunk,
    overlap, T5 bias, excluded window chunks, sink, k, select_only). `training` (dropout seed, rate, noise
    seed): ε drawn as evalm/summaries.py draws it, each probability times the keep decision of
    evalm/dropout_mask.py (a token by its position, chunk r as −1 − r), scaled by 1/(1 − p). `move(keys,
    shift)`: the selected tokens moved to the k·c positions before the query's window, in chunk order, and
    the sink keys (moved too) before them; with select_by "window-bound" each candidate ranked by Quest's bound
    over its keys moved to −c … −1, read by the query moved back by its window's start (so the chunk sits at
    start − c … start − 1 from it; the bound's per-channel extremes taken in that frame)."""
    B, T, H, D = q.shape
    w, c, ext, s, C = attn.window_size, attn.chunk_size, attn.ext, D**-0.5, T // attn.chunk_size
    select, only, sink = attn.layout.select, attn.layout.select_only, attn.layout.sink
    qc, kc, vc = (x[:, : C * c].reshape(B, C, c, H, D) for x in (q, k, v))
    k_tilde = attn.adaptive_mu_k(kc.mean(2))  # (B, C, H, D)
    omega = attn.adaptive_mu_q(qc.mean(2)) + k_tilde
    first = sink // c
    if training is not None:
        eps = summaries.noise(training[2], torch.empty(B, H, C - first, D, dtype=q.dtype)).transpose(1, 2)
        omega = torch.cat([omega[:, :first], omega[:, first:] + eps], 1)
    lam = s * (kc * omega[:, :, None]).sum(-1) - s * kc.pow(2).sum(-1) / 2
    beta = (torch.softmax(lam, 2)[..., None] * vc).sum(2)  # (B, C, H, D)
    token_logits = s * torch.einsum("bihd,bjhd->bhij", q, k)
    local_logits = token_logits
    if attn.rel_pos_bias is not None:
        table = attn.rel_pos_bias.relative_attention_bias.weight[:, 0]
        bucket = [[t5_bucket_ref(max(0, i - j - ext), len(table), w + ext) for j in range(T)] for i in range(T)]
        local_logits = local_logits + s * table[torch.tensor(bucket)]
    remote_logits = s * torch.einsum("bihd,brhd->bhir", q, k_tilde)  # (B, H, T, C)
    if attn.layout.select_by != "summary":  # Quest: Σ_d max(q_d·min_j k_jd, q_d·max_j k_jd) over chunk r's tokens j
        low, high = kc.amin(2), kc.amax(2)  # (B, C, H, D)
        rank_logits = s * torch.maximum(q[:, :, None] * low[:, None], q[:, :, None] * high[:, None]).sum(-1).permute(0, 3, 1, 2)
    else:
        rank_logits = remote_logits
    sink_logits, picked_logits = token_logits.clone(), token_logits.clone()
    local = torch.zeros(B, H, T, T, dtype=torch.bool)
    sunk, picked = torch.zeros_like(local), torch.zeros_like(local)
    remote = torch.zeros(B, H, T, C, dtype=torch.bool)
    for i in range(T):
        start = i // c * c if ablation is Ablation.CHUNK_WINDOW else max(0, i // w * w - ext)
        limit = 0 if ablation is Ablation.NO_REMOTE else start // c if attn.exclude_window_chunks else i // c
        local[..., i, start : i + 1] = True
        sunk[..., i, : min(sink, start)] = True
        remote[..., i, first:limit] = True
        candidates = range(first, min(limit, start // c))
        if attn.layout.select_by == "window-bound":  # chunk r's keys at −c + j, the query at i − start
            anchored = move(kc, torch.tensor([-c - r * c for r in range(C)]).view(1, C, 1, 1))  # (B, C, c, H, D)
            low, high = anchored.amin(2), anchored.amax(2)
            reader = move(q[:, i], torch.tensor(-start))[:, None]  # (B, 1, H, D)
            rank_logits[:, :, i] = s * torch.maximum(reader * low, reader * high).sum(-1).transpose(1, 2)
        if move is not None and sink:
            block_start = i // w * w if ablation is Ablation.CHUNK_WINDOW else max(0, i // w * w - ext)
            shift = torch.tensor(block_start - sink - select * c)
            sink_logits[..., i, :sink] = s * torch.einsum("bhd,bjhd->bhj", q[:, i], move(k[:, :sink], shift))
        for b in range(B):
            for h0 in range(0, H, group):
                score = {r: float(rank_logits[b, h0 : h0 + group, i, r].detach().sum()) for r in candidates}
                chosen = sorted(sorted(candidates, key=lambda r: (-score[r], r))[:select])
                for slot, r in enumerate(chosen):
                    picked[b, h0 : h0 + group, i, r * c : r * c + c] = True
                    remote[b, h0 : h0 + group, i, r] = False
                    if move is not None:  # to start − k·c + slot·c + j
                        keys = move(k[b, r * c : r * c + c, h0 : h0 + group], torch.tensor(start - select * c + slot * c - r * c))
                        picked_logits[b, h0 : h0 + group, i, r * c : r * c + c] = s * (keys * q[b, i, h0 : h0 + group]).sum(-1).T
    if only:
        remote[:] = False
    logits = torch.cat([local_logits.masked_fill(~local, float("-inf")), sink_logits.masked_fill(~sunk, float("-inf")),
                        remote_logits.masked_fill(~remote, float("-inf")), picked_logits.masked_fill(~picked, float("-inf"))], -1)
    values = torch.cat([v.transpose(1, 2), v.transpose(1, 2), beta.transpose(1, 2), v.transpose(1, 2)], -2)
    p = torch.softmax(logits, -1)
    if training is not None:
        seed, rate = training[:2]
        ids = torch.cat([torch.arange(T), torch.arange(T), dropout_mask.chunk_key(torch.arange(C)), torch.arange(T)])
        kept = dropout_mask.keep(seed, rate, torch.arange(B).view(B, 1, 1, 1), torch.arange(H).view(1, H, 1, 1),
                                 torch.arange(T).view(1, 1, T, 1), ids.view(1, 1, 1, -1))
        p = p * kept / (1 - rate)
    return (p @ values).transpose(1, 2)


def test_the_choice_by_hand():
    """The right chunk wins, ties go to the earlier chunk, a group of heads shares one choice from its summed
    scores, a query with fewer candidates than k picks fewer."""
    inf = float("-inf")
    scores = torch.tensor([[1.0, 3.0, 3.0, 3.0, inf], [2.0, inf, inf, inf, inf]]).view(1, 1, 1, 2, 5)
    chosen, index, valid = selection.choose(scores, 2, 1)
    assert index[0, 0, 0].tolist() == [[1, 2], [0, 0]] and valid[0, 0, 0].tolist() == [[True, True], [True, False]]
    assert chosen[0, 0, 0].tolist() == [[False, True, True, False, False], [True, False, False, False, False]]
    # head 0 prefers chunk 1, head 1 chunk 2; their sum prefers chunk 2, which both heads then read
    scores = torch.tensor([[1.0, 3.0, 0.0, 2.0], [1.0, -1.0, 5.0, 2.0]]).view(1, 1, 2, 1, 4)
    assert selection.choose(scores, 1, 2)[1].flatten().tolist() == [2, 2]
    assert selection.choose(scores, 1, 1)[1].flatten().tolist() == [1, 2]


@pytest.mark.parametrize("k, group, ties", [(1, 1, False), (2, 1, False), (4, 2, False), (9, 1, False), (12, 1, False),
                                             (2, 1, True), (3, 2, True)])
def test_one_topk_chooses_as_the_tie_rule_does(k, group, ties):
    """`choose`'s one topk (no tie at any query's cut) and its tie rule (`_choose_ties`, earliest first) give the
    same choice, with −inf non-candidates and rows of fewer than k candidates; integer scores force ties."""
    g = torch.Generator().manual_seed(k * 10 + group)
    scores = torch.randn(2, 3, 4, 5, 9, generator=g)
    if ties:
        scores = scores.mul(2).round()
    scores = scores.masked_fill(torch.rand(scores.shape, generator=g) < 0.3, float("-inf"))
    scores[0, 0, :, 0, 2:] = float("-inf")  # a query with at most 2 candidates
    got = selection.choose(scores, k, group)
    summed = scores.unflatten(2, (4 // group, group)).sum(3)
    want = [x.repeat_interleave(group, 2) for x in selection._choose_ties(summed, min(k, 9))]
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def mean_key_layer(**changes):
    """The first layer of a model selecting one chunk whose A_k is the identity: a summary key is its chunk's mean key."""
    attn = model(select_chunks=1, adaptive_proj="no-ln", **changes).blocks[0].attn
    with torch.no_grad():
        attn.adaptive_mu_k[0].weight.copy_(torch.eye(attn.head_dim))
        attn.adaptive_mu_k[0].bias.zero_()
    return attn


def test_the_chunk_holding_the_key_is_read_exactly():
    """A query built to match one key of a far chunk: EVA's summary averages it with its chunk-mates, selection
    reads the key itself, so the output is that key's value (the recall study's failure, by hand). A_k is the
    identity, so a chunk's summary key is its mean key and the chunk holding the key scores highest."""
    attn = mean_key_layer()
    T, H, D = 40, attn.n_head, attn.head_dim
    gen = torch.Generator().manual_seed(3)
    k = 0.2 * torch.randn(1, T, H, D, generator=gen, dtype=torch.float64)  # small keys, one large: token 5's
    k[0, 5] = torch.randn(H, D, generator=gen, dtype=torch.float64)
    v = torch.randn(1, T, H, D, generator=gen, dtype=torch.float64)
    q = torch.zeros(1, T, H, D, dtype=torch.float64)
    q[0, 37] = 6.0 * k[0, 5]  # the last query looks for token 5 (chunk 1, far before its window)
    with torch.no_grad():
        out = attn.attend(q.clone(), k.clone(), v.clone())
        attn.layout = dataclasses.replace(attn.layout, select=0)
        plain = attn.attend(q.clone(), k.clone(), v.clone())
    error, plain_error = ((x[0, 37] - v[0, 5]).norm() / v[0, 5].norm() for x in (out, plain))
    assert error < 0.3 < plain_error


def test_the_bound_finds_the_key_a_mean_averages_away():
    """Quest's bound (`select_by = "bound"`) on a case built by hand: the key the query seeks sits among
    chunk-mates pointing the other way, so its chunk's mean key (the summary's, A_k the identity) scores lowest
    while every other chunk's mean scores a little. The summaries then select a wrong chunk; the bound, at
    least each token's logit, selects the right one, and the output is the sought key's value."""
    outputs = {}
    for by in ("summary", "bound"):
        attn = mean_key_layer(select_by=by)
        T, H, D = 40, attn.n_head, attn.head_dim
        gen = torch.Generator().manual_seed(3)
        u = torch.randn(H, D, generator=gen, dtype=torch.float64)
        k = 0.3 * u + 0.05 * torch.randn(1, T, H, D, generator=gen, dtype=torch.float64)  # every chunk leans to u
        k[0, 4:8] = -u  # chunk 1: three keys against u, then token 5 along it
        k[0, 5] = u
        v = torch.randn(1, T, H, D, generator=gen, dtype=torch.float64)
        q = torch.zeros(1, T, H, D, dtype=torch.float64)
        q[0, 37] = 6.0 * u  # the last query looks for token 5, far before its window
        with torch.no_grad():
            outputs[by] = attn.attend(q.clone(), k.clone(), v.clone())
            assert (outputs[by] - oracle(attn, q, k, v)).abs().max() < EXACT
    error = {by: float((x[0, 37] - v[0, 5]).norm() / v[0, 5].norm()) for by, x in outputs.items()}
    assert error["bound"] < 0.3 < error["summary"]


@pytest.mark.parametrize("shape", SHAPES)
def test_every_whole_sequence_route_equals_the_equation(shape):
    m = model(**SHAPES[shape])
    attn = m.blocks[0].attn
    x = torch.randn(2, 45, BASE.d_model, dtype=torch.float64)  # 45: a padded last block
    with torch.no_grad():
        q, k, v = heads(attn, x)
        expected = oracle(attn, q, k, v)
        attn.layout = dataclasses.replace(attn.layout, select=0, select_only=False)
        assert (expected - attn.attend(q.clone(), k.clone(), v.clone())).abs().max() > APART  # selection acts
        attn.layout = dataclasses.replace(attn.layout, select=SHAPES[shape]["select_chunks"],
                                          select_only=SHAPES[shape].get("select_only", False))
    fused = "sink_tokens" not in SHAPES[shape]  # the fused path reads no sink (evalm/eva_paths.py)
    for facts in ({}, SELECTION_KERNEL, PLAIN, TILES):
        for grad in (False, True):
            with forced(**facts), recorded() as taken, torch.set_grad_enabled(grad):
                out = attn.attend(q.clone(), k.clone(), v.clone())
            assert (out - expected).abs().max() < EXACT, taken[0].name
            # a whole sequence on the kernel; else a long call without a graph puts its shared key sets on it
            want = "tiles-kernel" if facts is SELECTION_KERNEL and not grad else "tiles"
            assert {p.name for p in taken} == {"fused" if fused and facts in ({}, SELECTION_KERNEL) else want}


@pytest.mark.parametrize("ablation", [Ablation.CHUNK_WINDOW, Ablation.NO_REMOTE])
def test_ablations_change_the_candidates_as_the_rule_says(ablation):
    m = model(select_chunks=2)
    attn = m.blocks[0].attn
    x = torch.randn(1, 41, BASE.d_model, dtype=torch.float64)
    with torch.no_grad():
        q, k, v = heads(attn, x)
        ablate(m, ablation)
        assert (attn.attend(q.clone(), k.clone(), v.clone()) - oracle(attn, q, k, v, ablation=ablation)).abs().max() < EXACT


def test_a_group_of_heads_shares_one_choice():
    """A grouped-query host (two query heads per K/V head): the oracle's choice from summed scores."""
    m = model(select_chunks=1)
    attn = m.blocks[0].attn
    attn.layout = dataclasses.replace(attn.layout, select_group=2)
    x = torch.randn(1, 45, BASE.d_model, dtype=torch.float64)
    with torch.no_grad():
        q, k, v = heads(attn, x)
        k, v = k[:, :, 0::2].repeat_interleave(2, 2), v[:, :, 0::2].repeat_interleave(2, 2)  # K/V heads repeated
        grouped = oracle(attn, q, k, v, group=2)
        assert (attn.attend(q.clone(), k.clone(), v.clone()) - grouped).abs().max() < EXACT
        assert (grouped - oracle(attn, q, k, v, group=1)).abs().max() > APART  # the group's choice differs


@pytest.mark.parametrize("shape", ["k2", "k2-sink", "k2-only-sink-overlap", "k2-bound"])
def test_selected_tokens_moved_before_the_window_equal_the_equation(shape):
    """With `select_shift` (what a RoPE host sets for selected_positions = 'window') each query reads its chosen
    tokens moved to the k·c positions before its window; moved sink keys sit before them. Whole sequences (one
    and many tiles), the cache in segments, forks."""
    m = model(**SHAPES[shape])
    for block in m.blocks:
        block.attn.select_shift = move
        block.attn.sink_shift = move if "sink" in shape else None
    attn = m.blocks[0].attn
    x = torch.randn(2, 45, BASE.d_model, dtype=torch.float64)
    with torch.no_grad():
        q, k, v = heads(attn, x)
        expected = oracle(attn, q, k, v, move=move)
        assert (expected - oracle(attn, q, k, v)).abs().max() > APART  # the move changes the equation
        assert (attn.attend(q.clone(), k.clone(), v.clone()) - expected).abs().max() < EXACT
        attn.query_tile = 8  # one block per tile, many tiles per group
        assert (attn.attend(q.clone(), k.clone(), v.clone()) - expected).abs().max() < EXACT
        check_cache_matches_whole(m)


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "written-out"])
@pytest.mark.parametrize("shape", ["k2", "k3-only", "k2-sink", "k2-bound", "k1-bound-only-sink-t5"])
def test_the_cache_in_segments_and_forks_equal_one_shot(shape, kernel):
    """Each call as if long enough for the kernel path (the shared key sets on the fused kernel, `EvaPath.kernel`),
    then written out, as under a graph or where the kernel is not available."""
    m = model(**SHAPES[shape])
    tokens = torch.randint(0, BASE.vocab_size, (2, 61), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), forced(**(SELECTION_KERNEL if kernel else PLAIN)):
        whole = m(tokens)
        cache, parts = m.new_cache(batch_size=2), []
        for lo, hi in ((0, 3), (3, 11), (11, 30), (30, 61)):
            parts.append(m(tokens[:, lo:hi], cache=cache))
        assert (torch.cat(parts, 1) - whole).abs().max() < EXACT
        # one token at a time: the rows grow in place in one buffer
        cache, parts = m.new_cache(batch_size=2), []
        for i in range(61):
            parts.append(m(tokens[:, i : i + 1], cache=cache))
        assert (torch.cat(parts, 1) - whole).abs().max() < EXACT
        trunk = m.new_cache()
        m(tokens[:1, :29], cache=trunk)
        tails = torch.randint(0, BASE.vocab_size, (3, 9), generator=torch.Generator().manual_seed(5))
        for width in (2, 9):  # short inputs folded over the parent; longer ones completing chunks of their own
            with recorded() as taken:
                batched = m(tails[:, :width], cache=trunk.fork(batch_size=3))
            for b in range(3):
                alone = m(torch.cat([tokens[:1, :29], tails[b : b + 1, :width]], 1))[:, 29:]
                assert (batched[b : b + 1] - alone).abs().max() < EXACT
            assert ("forks" in {p.route.value for p in taken}) == (width == 2)
            assert {p.kernel for p in taken} == {kernel}
        m(tokens[:1, 29:40], cache=trunk)  # the parent grows on after its forks: theirs stay as they were
        again = m(tails[:, :2], cache=trunk.fork(batch_size=3))
        assert (again[0:1] - m(torch.cat([tokens[:1, :40], tails[:1, :2]], 1))[:, 40:]).abs().max() < EXACT


@pytest.mark.parametrize("by", ["summary", "bound"])
def test_in_training_selection_takes_the_dropout_and_noise_every_path_draws(by):
    m = model(select_chunks=2, sink_tokens=4, attn_dropout=0.3, select_by=by)
    attn = m.blocks[0].attn
    check_training_draws(attn, lambda q, k, v, training: oracle(attn, q, k, v, training=training))


@pytest.mark.parametrize("shape", ["k2", "k2-only-sink-overlap", "k2-bound"])
def test_gradients_equal_the_equations(shape):
    """The choice carries no gradient; everything it selects does: d q, d k, d v and A_q/A_k's gradients are
    the oracle's. With select_only the maps reach the output through the choice alone, so neither gets one (a
    router trained this way stays at its initial maps: docs/eva.md, "Selection")."""
    m = model(**SHAPES[shape])
    attn = m.blocks[0].attn
    x = torch.randn(1, 37, BASE.d_model, dtype=torch.float64)
    q, k, v = (t.detach().requires_grad_() for t in heads(attn, x))
    weight = torch.randn(1, 37, attn.n_head, attn.head_dim, dtype=torch.float64)
    params = list(attn.adaptive_mu_q.parameters()) + list(attn.adaptive_mu_k.parameters())
    got = torch.autograd.grad((attn.attend(q, k, v) * weight).sum(), [q, k, v, *params], allow_unused=True)
    want = torch.autograd.grad((oracle(attn, q, k, v) * weight).sum(), [q, k, v, *params], allow_unused=True)
    got, want = ([torch.zeros_like(x) if g is None else g for g, x in zip(grads, [q, k, v, *params])] for grads in (got, want))
    assert all(bool(g.abs().max() == 0) == SHAPES[shape].get("select_only", False) for g in want[3:])
    for a, b in zip(got, want):
        assert (a - b).abs().max() < EXACT


def test_select_chunks_zero_is_eva_bit_for_bit():
    """The default takes EVA's own paths and gives its outputs exactly (the same weights, a model built with
    the setting spelled out)."""
    plain, zero = model(), model(select_chunks=0)
    zero.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, BASE.vocab_size, (2, 45), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), recorded() as taken:
        assert torch.equal(plain(tokens), zero(tokens))
    assert "tiles" not in {p.name for p in taken}


def test_settings_refuse_what_selects_nothing():
    with pytest.raises(ConfigError, match="select_chunks=-1"):
        build(EvaSettings, {"select_chunks": -1}, where="test")
    with pytest.raises(ConfigError, match="select_only without select_chunks"):
        build(EvaSettings, {"select_only": True}, where="test")
    with pytest.raises(ConfigError, match="select_by='bound' without select_chunks"):
        build(EvaSettings, {"select_by": "bound"}, where="test")
    with pytest.raises(ConfigError, match="select_by"):
        build(EvaSettings, {"select_chunks": 1, "select_by": "best"}, where="test")
    with pytest.raises(ConfigError, match="window-bound' ranks keys moved by a rotary host"):  # the native model
        build(ModelConfig, {**dataclasses.asdict(BASE), "select_chunks": 1, "select_by": "window-bound"}, where="test")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_selection_takes_the_tiles_and_equals_the_oracle():
    """No flex form yet: a whole sequence with selection on CUDA takes the tiles route (evalm/eva_paths.py says
    why), in float64 equal to the CPU oracle; the cache in segments equals the whole sequence there too."""
    m = model(select_chunks=2, sink_tokens=4).to("cuda")
    attn = m.blocks[0].attn
    x = torch.randn(2, 45, BASE.d_model, dtype=torch.float64)
    with torch.no_grad():
        q, k, v = heads(attn.cpu(), x)
        expected = oracle(attn, q, k, v)
        attn.to("cuda")
        with recorded() as taken:
            out = attn.attend(*(t.cuda() for t in (q, k, v)))
        assert {p.name for p in taken} == {"tiles"} and (out.cpu() - expected).abs().max() < EXACT
        tokens = torch.randint(0, BASE.vocab_size, (2, 61), device="cuda")
        cache = m.new_cache(batch_size=2)
        parts = [m(tokens[:, lo:hi], cache=cache) for lo, hi in ((0, 11), (11, 30), (30, 61))]
        assert (torch.cat(parts, 1) - m(tokens)).abs().max() < EXACT


def test_selection_read_at_evaluation_time_on_a_model_s_own_weights():
    """`--eva-select K` (icl_eval.models.loading.select_lm): every EVA layer selects, the weights unchanged, so
    the scores move and K = 0 gives the model's own again; a model without EVA attention is refused in one line,
    and a K past the bound is refused as the setting it is."""
    from evalm.icl_eval.config import RunOptions
    from evalm.icl_eval.models.lm import EvalmLM
    from evalm.icl_eval.models.loading import select_lm
    from evalm.text.tokenizer import ByteTokenizer

    m = model()
    tokens = torch.randint(0, BASE.vocab_size, (1, 45), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        own = m(tokens)
        select_lm(EvalmLM(m, ByteTokenizer()), 2)
        assert {b.attn.layout.select for b in m.blocks} == {2} and (m(tokens) - own).abs().max() > APART
        select_lm(EvalmLM(m, ByteTokenizer()), 0)
        assert torch.equal(m(tokens), own)
    full = models.visible_model(dataclasses.replace(BASE, attention="full"))
    with pytest.raises(ConfigError, match="has no EVA attention layer to select in") as err:
        select_lm(EvalmLM(full, ByteTokenizer()), 2)
    assert "\n" not in str(err.value)
    select_lm(EvalmLM(full, ByteTokenizer()), 0)  # nothing to switch off: allowed
    with pytest.raises(ConfigError, match="eva_select = 100000"):
        build(RunOptions, {"eva_select": 100000}, where="test")
