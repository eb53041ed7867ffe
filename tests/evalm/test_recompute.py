"""EVA's recomputing training attention against two gradient oracles, on both of its paths: PyTorch's
fused CPU kernel (evalm/flash.py, path "fused", the default, attention dropout included) and the
plain-PyTorch recomputation (evalm/recompute.py, path "recompute"). Dropout against the per-token
oracle: tests/evalm/test_fused_dropout.py.

Oracles, float64, every parameter's gradient and the input's:
1. the autograd path through `tiles.attend` (path "tiles", the implementation before
   recomputation, pinned with `forced(**TILES)`), on its single-tile, multi-tile and grouped paths;
2. `eva_per_token_torch`, the per-token closed form (docs/eva.md; tests/evalm/oracle.py).
Dropout is checked by gradcheck: backward equals the numerical derivative of the very forward
whose keep masks it must replay. Memory: the graph keeps O(n·D) tensors, not O(n·(w + n/c)).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import evalm.flash
import evalm.flash_sweep
import evalm.recompute
import evalm.tiles
import evalm.tiling
from evalm import whole_sequence
from evalm.summaries import AdaptiveMaps
from evalm.whole_sequence import WholeSequence, eva_attention
from evalm.tiling import Tiling
from tests.evalm.oracle import eva_per_token_torch
from tests.evalm.paths import PLAIN, TILES, forced
from tests.evalm.test_eva import BASE, VARIANTS, make_attention, make_model, tokens

EXACT = 1e-10


def _grads(attn, fn, x: torch.Tensor, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """Output and d(Σ weight·out)/d(x and every parameter)."""
    x = x.clone().requires_grad_(True)
    attn.zero_grad(set_to_none=True)
    out = fn(x)
    (out * weight).sum().backward()
    got = {"out": out.detach(), "x": x.grad}
    got.update({name: p.grad for name, p in attn.named_parameters()})
    return got


def _assert_same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name in got:
        if got[name] is None or want[name] is None:  # a path where no chunk is ever visible
            assert not any(g is not None and g.abs().max() > 0 for g in (got[name], want[name])), name
            assert name.startswith("adaptive_mu"), name
            continue
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=EXACT, msg=name)


def _bf16_autocast_grads(monkeypatch, low, x, weight) -> tuple[dict[str, torch.Tensor], list[torch.dtype]]:
    """`low`'s output and gradients under bf16 autocast, and the dtypes the fused kernel was called with."""
    kernel_dtypes, real = [], evalm.flash.Kernel.forward

    def recording(kernel, scale):
        kernel_dtypes.append(kernel.q.dtype)
        return real(kernel, scale)

    monkeypatch.setattr(evalm.flash.Kernel, "forward", recording)

    def under_autocast(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return low(x).float()

    return _grads(low, under_autocast, x.float(), weight.float()), kernel_dtypes


def _inputs(n: int, batch: int = 2):
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(batch, n, 32, dtype=torch.float64, generator=gen)
    return x, torch.randn(batch, n, 32, dtype=torch.float64, generator=gen)


def _flash_groups(monkeypatch, rows: int = 40) -> list:
    """Remote groups of `rows` queries on the fused path (several per test sequence, each with a
    staircase tail); returns the list of each call's groups, so a test can see the path was taken."""
    monkeypatch.setattr(evalm.flash_sweep, "ROWS", rows)
    monkeypatch.setattr(evalm.flash_sweep, "RANGE_ROWS", 32)  # backward in many ranges, partial over a batch of 2
    monkeypatch.setattr(evalm.flash_sweep, "BACKWARD_ROWS", rows // 2 + 1)  # other groups, prefix pieces
    seen, real = [], evalm.flash.remote_groups
    monkeypatch.setattr(evalm.flash, "remote_groups", lambda *a: seen.append(real(*a)) or seen[-1])
    return seen


# n = 13: one block, no remote chunk for the first queries; 77: several blocks, a padded tail;
# 300: more than the old path's 256-row tile, with groups forced small on every path.
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "ops"])
@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("n", [13, 77, 300])
def test_gradients_equal_the_autograd_path(name, n, fused, monkeypatch):
    attn = make_attention(**VARIANTS[name])
    x, weight = _inputs(n)
    seen = _flash_groups(monkeypatch)
    if n == 300:  # several groups on both paths
        monkeypatch.setattr(evalm.tiles, "TILE_LOGITS", 2 * 4 * 256 * 400)
        monkeypatch.setattr(evalm.tiling, "GROUP_LOGITS", 2 * 4 * 3 * attn.window_size * 120)
    with forced(**({} if fused else PLAIN)):
        new = _grads(attn, attn, x, weight)
    assert bool(seen) == fused  # the path under test is the one taken
    if fused and n == 300:
        assert len(seen[0]) > 3 and any(g.end > g.prefix > 0 for g in seen[0])  # prefix and tail calls
    with forced(**TILES):
        old = _grads(attn, attn, x, weight)
    _assert_same(new, old)
    if n == 300:  # the forced groups really split the sequence
        t = Tiling(attn.window_size, attn.chunk_size, attn.ext, attn.exclude_window_chunks, 1.0,
                   group_logits=evalm.tiling.GROUP_LOGITS)
        assert len(evalm.recompute.groups(t, 8, -(-n // attn.window_size), n // attn.chunk_size)) > 1


def _pieces(attn, n: int, batch_heads: int = 8) -> list:
    """The groups of an n-token sequence that are pieces of a block (fewer than w rows)."""
    t = Tiling(attn.window_size, attn.chunk_size, attn.ext, attn.exclude_window_chunks, 1.0,
               group_logits=evalm.tiling.GROUP_LOGITS)
    found = evalm.recompute.groups(t, batch_heads, -(-n // attn.window_size), n // attn.chunk_size)
    return [g for g in found if g.r1 - g.r0 < attn.window_size]


@pytest.mark.parametrize("name", ["w16c4-t5", "w8c4-overlap-t5", "w16c4-exclude"])
def test_blocks_cut_into_row_pieces_keep_the_gradients(name, monkeypatch):
    """A block whose queries see more chunks than the logit budget allows runs in row pieces."""
    monkeypatch.setattr(evalm.recompute, "MIN_PIECE", 3)
    attn = make_attention(**VARIANTS[name])
    # about 5 rows per piece late in the sequence
    monkeypatch.setattr(evalm.tiling, "GROUP_LOGITS", 8 * 5 * (2 * attn.window_size + 30))
    x, weight = _inputs(200)
    assert len(_pieces(attn, 200)) > 4
    with forced(**PLAIN):  # pieces are the plain-PyTorch path's
        new = _grads(attn, attn, x, weight)
    with forced(**TILES):
        _assert_same(new, _grads(attn, attn, x, weight))


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "ops"])
@pytest.mark.parametrize("name", ["w16c4-t5", "w8c4-overlap-t5", "w16c4-exclude", "w16c16"])
def test_gradients_equal_the_per_token_oracle(name, fused, monkeypatch):
    _flash_groups(monkeypatch, rows=24)
    attn = make_attention(**VARIANTS[name])
    monkeypatch.setattr(evalm.tiling, "GROUP_LOGITS", 2 * 4 * 2 * attn.window_size * 40)  # a few blocks per group
    x, weight = _inputs(70)
    with forced(**({} if fused else PLAIN)):
        got = _grads(attn, attn, x, weight)
    _assert_same(got, _grads(attn, lambda x: eva_per_token_torch(attn, x), x, weight))


def _function_inputs(ext: int, n_blocks: int = 5):
    """w, c, the adaptive maps and (q, k, v, bias) of a direct `eva_attention` call, float64."""
    gen = torch.Generator().manual_seed(7)
    w, c, D = 8, 4, 6
    N = n_blocks * w
    torch.manual_seed(7)
    maps = AdaptiveMaps(*(torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.LayerNorm(D)).double() for _ in range(2)))
    shapes = [(1, N, 2, D)] * 3 + [(w, ext + w)]
    return w, c, maps, [torch.randn(*shape, dtype=torch.float64, generator=gen, requires_grad=True) for shape in shapes]


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "ops"])
@pytest.mark.parametrize("ext, budget", [(0, 2 * 2 * 8 * 30), (8, 2 * 2 * 8 * 30), (8, 2 * 2 * 3 * 30)])
def test_dropout_masks_and_noise_are_replayed_exactly_in_backward(ext, budget, fused, monkeypatch):
    """gradcheck: backward equals the numerical derivative of the very forward whose dropout masks
    and training noise ε (both from seeds) it must replay while recomputing the chunk state."""
    monkeypatch.setattr(evalm.recompute, "MIN_PIECE", 3)  # the smallest budget cuts blocks into pieces
    _flash_groups(monkeypatch, rows=16)  # the fused path in several groups, ranges and prefix pieces
    monkeypatch.setattr(evalm.flash_sweep, "BACKWARD_CHUNKS", 3)
    w, c, maps, inputs = _function_inputs(ext)
    tiling = Tiling(w, c, ext, False, 0.4, dropout=0.3, seed=11, group_logits=budget, noise_seed=5)

    def attend(*x, t=tiling):
        return eva_attention(WholeSequence(t, whole_sequence.FUSED if fused else whole_sequence.PLAIN, maps), *x)

    assert torch.autograd.gradcheck(attend, inputs, eps=1e-6, atol=1e-8, fast_mode=True)
    dropped = attend(*inputs)
    assert (dropped - attend(*inputs, t=dataclasses.replace(tiling, dropout=0.0))).abs().max() > 1e-3  # dropout acts
    assert (dropped - attend(*inputs, t=dataclasses.replace(tiling, noise_seed=None))).abs().max() > 1e-3  # ε acts
    torch.testing.assert_close(attend(*inputs), dropped, rtol=0, atol=0)  # one seed, one set of masks
    assert (attend(*inputs, t=dataclasses.replace(tiling, seed=12)) - dropped).abs().max() > 1e-3


def test_module_dropout_trains_and_is_fresh_each_forward():
    attn = make_attention(attn_dropout=0.5, use_t5_bias=True)
    attn.train()
    x, weight = _inputs(40)
    torch.manual_seed(3)
    a = _grads(attn, attn, x, weight)
    torch.manual_seed(3)
    b = _grads(attn, attn, x, weight)
    _assert_same(a, b)  # the seed comes from torch's generator: reproducible under manual_seed
    assert (attn(x) - a["out"]).abs().max() > 1e-3


def _saved(fn) -> list[torch.Tensor]:
    """Every tensor autograd's graph of fn() saves for backward."""
    saved = []

    def pack(t):
        saved.append(t)
        return t

    def unpack(t):
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        fn()
    return saved


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_graph_keeps_linear_memory_and_no_chunk_state():
    """The recomputing path saves O(n·E) bytes and nothing chunk-sized (k̃, ω, β, the maps' inputs
    and outputs are recomputed in backward); the autograd path saves every tile's probabilities."""
    attn = make_attention(window_size=32, chunk_size=4).float()
    attn.train()
    x = torch.randn(1, 2048, 32, requires_grad=True)
    per_token = 2048 * 32 * 4  # one float per token and model dimension
    new = _saved(lambda: attn(x))
    chunk_sized = [t.shape for t in new if 2048 // 4 in t.shape]
    assert not chunk_sized, chunk_sized
    with forced(**TILES):
        old = _saved(lambda: attn(x))
    assert _nbytes(new) < 10 * per_token < 40 * per_token < _nbytes(old)


def test_model_loss_gradients_equal_the_autograd_path():
    model = make_model(use_t5_bias=True)
    x = tokens(90, batch=2)
    grads = []
    for facts in ({}, TILES):
        model.zero_grad(set_to_none=True)
        with forced(**facts):
            model(x[:, :-1], targets=x[:, 1:]).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=0, atol=EXACT, msg=name)


def test_activation_checkpointing_replays_the_dropout_seed():
    """train/parallelize.py checkpoints each Block with preserve_rng_state: the recomputed forward
    draws the same dropout seed and noise, so gradients equal those without checkpointing."""
    from torch.utils.checkpoint import checkpoint

    model = make_model(attn_dropout=0.3, dropout=0.1, use_t5_bias=True).train()
    block = model.blocks[0]
    x = torch.randn(2, 70, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    grads = []
    for wrapped in (False, True):
        torch.manual_seed(4)
        block.zero_grad(set_to_none=True)
        (checkpoint(block, x, use_reentrant=False, preserve_rng_state=True) if wrapped else block(x)).sum().backward()
        grads.append({n: p.grad.clone() for n, p in block.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=0, atol=EXACT, msg=name)


def test_bf16_autocast_does_not_reach_inside_the_function():
    """bf16 inputs give the same result whether or not autocast is on: autocast would otherwise
    recast every matmul of the group loop to bf16 behind the Function's own choice of precision."""
    w, c, maps, inputs = _function_inputs(0)
    maps = AdaptiveMaps(*(m.float() for m in maps))
    low = [x.detach().to(torch.bfloat16).requires_grad_(True) for x in inputs]
    tiling = Tiling(w, c, 0, False, 0.4)
    outs = []
    for enabled in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
            out = eva_attention(WholeSequence(tiling, maps=maps), *low)
        out.float().pow(2).sum().backward()
        outs.append([out.detach()] + [x.grad.clone() for x in low])
        for x in low:
            x.grad = None
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_training_on_the_fused_and_plain_paths_follows_one_trajectory():
    """Thirty AdamW steps (residual and attention dropout and the training noise ε on, fresh each
    step) give the same losses on the fused kernel and on the plain-PyTorch path: in float64 the two
    differ only by rounding (both draw one attention dropout mask, evalm/dropout_mask.py), so any
    drift between them would be a difference in what they compute."""
    data = torch.randint(0, BASE.vocab_size, (3, 2, 257), generator=torch.Generator().manual_seed(5))

    def losses(fused: bool) -> list[float]:
        model = make_model(dropout=0.1, attn_dropout=0.1).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        out = []
        for step in range(30):  # three batches, ten times each: enough to learn something
            line = data[step % 3]
            torch.manual_seed(100 + step)
            with forced(**({} if fused else PLAIN)):
                loss = model(line[:, :-1], targets=line[:, 1:])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            out.append(loss.item())
        return out

    fused, plain = losses(True), losses(False)
    assert fused[-1] < fused[0] - 0.05  # it trains
    torch.testing.assert_close(torch.tensor(fused), torch.tensor(plain), rtol=0, atol=1e-12)


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm())


@pytest.mark.parametrize("name", ["w16c4-t5", "w8c4-overlap-t5"])
def test_bf16_runs_natively_on_the_fused_path_within_bf16_of_the_float64_path(name, monkeypatch):
    """Under bf16 autocast the fused kernel gets bf16 q, k, v (no sequence-sized fp32 copies; the
    local blocks go to it in fp32 one range at a time) and the output and every gradient stay
    within bf16's reach of the float64 path (merges and gradient sums in fp32)."""
    attn = make_attention(**VARIANTS[name])
    x, weight = _inputs(300)
    want = _grads(attn, attn, x, weight)
    low = make_attention(**VARIANTS[name]).float()
    got, kernel_dtypes = _bf16_autocast_grads(monkeypatch, low, x, weight)
    assert torch.bfloat16 in kernel_dtypes  # the remote parts run in bf16: fails if the Function upcasts
    for key in want:
        if want[key] is None:
            continue
        error = _relative_error(got[key], want[key])
        assert error < 3e-2, (key, error)


def test_the_fused_backward_leaves_a_direct_callers_inputs_intact():
    """Without `consume`, the fused backward writes its gradients over copies: q, k, v keep their
    values (they would hold dq, dk, dv otherwise)."""
    w, c, maps, inputs = _function_inputs(0)
    before = [x.detach().clone() for x in inputs]
    tiling = Tiling(w, c, 0, False, 0.4)
    eva_attention(WholeSequence(tiling, maps=maps), *inputs).pow(2).sum().backward()
    for x, kept in zip(inputs, before):
        torch.testing.assert_close(x.detach(), kept, rtol=0, atol=0)
        assert x.grad is not None and x.grad.abs().max() > 0
