"""Attention dropout on the fused path (evalm/flash.py) against the per-token oracle replaying its mask.

The oracle (`eva_per_token_torch` with `dropout=(seed, p)`, tests/evalm/oracle.py) computes each
query's joint softmax apart from the module and multiplies it by the keep decisions of
evalm/dropout_mask.py, the one definition both share. So the fused forward and backward (two
kernel calls per part, the mask regenerated in backward) must equal it to float64 rounding; with
dropout switched off on the fused path these tests fail by the dropped probabilities (~1e-2).
The training noise ε is pinned off (`_noise_seed`): the oracle has none, and it is tested apart.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import evalm.flash_sweep
from evalm import dropout_mask
from evalm.tiling import Tiling
from evalm.whole_sequence import WholeSequence, eva_attention
from tests.evalm.oracle import eva_per_token_torch
from tests.evalm.paths import PLAIN, forced
from tests.evalm.test_eva import VARIANTS, make_attention
from tests.evalm.test_recompute import (EXACT, _assert_same, _bf16_autocast_grads, _flash_groups, _function_inputs, _grads,
                                        _inputs, _relative_error)

P = 0.1  # the paper's attention dropout
SEED = 1234


def _dropping(monkeypatch, seed: int = SEED, p: float = P, **changes):
    """An EVA layer in training with attention dropout p, its mask's seed pinned, no ε."""
    attn = make_attention(attn_dropout=p, **changes).train()
    monkeypatch.setattr(attn, "_dropout_seed", lambda: seed)
    monkeypatch.setattr(attn, "_noise_seed", lambda: None)
    return attn


def _small_tiles(monkeypatch, rows: int = 24) -> list:
    """The fused path in several remote groups, backward ranges and prefix pieces of 3 chunks."""
    seen = _flash_groups(monkeypatch, rows)
    monkeypatch.setattr(evalm.flash_sweep, "BACKWARD_CHUNKS", 3)
    return seen


@pytest.mark.parametrize("name", ["w16c4-t5", "w8c4-overlap-t5", "w16c4-exclude", "w16c16"])
def test_fused_dropout_equals_the_per_token_oracle_replaying_its_mask(name, monkeypatch):
    """Output and the gradients of the input and of every parameter (projections, adaptive maps,
    T5 bias), float64, to 1e-10: forward and backward drop the same probabilities as the oracle."""
    seen = _small_tiles(monkeypatch)
    attn = _dropping(monkeypatch, **VARIANTS[name])
    x, weight = _inputs(70)
    got = _grads(attn, attn, x, weight)
    assert seen  # the fused path was taken, in training, with attention dropout
    _assert_same(got, _grads(attn, lambda x: eva_per_token_torch(attn, x, dropout=(SEED, P)), x, weight))
    undropped = eva_per_token_torch(attn, x).detach()
    assert (got["out"] - undropped).abs().max() > 1e-3  # dropout acts


def test_the_mask_does_not_depend_on_the_tiling(monkeypatch):
    """Other group, range and piece sizes on the fused path, and the plain path's block groups, draw
    the same mask: outputs and gradients equal to float64 rounding; so does the mask function
    evaluated on a grid at once or piece by piece."""
    attn = _dropping(monkeypatch, **VARIANTS["w8c4-overlap-t5"])
    x, weight = _inputs(150)
    want = _grads(attn, attn, x, weight)  # the default sizes: one range, one group
    with monkeypatch.context() as m:
        seen = _small_tiles(m, rows=40)
        _assert_same(_grads(attn, attn, x, weight), want)
        assert len(seen[0]) > 3  # several remote groups
    with monkeypatch.context() as m:
        m.setattr(evalm.tiling, "GROUP_LOGITS", 2 * 4 * 16 * 30)  # several block groups
        with forced(**PLAIN):
            _assert_same(_grads(attn, attn, x, weight), want)
    grid = (torch.tensor(1).view(1, 1, 1), torch.arange(4).view(4, 1, 1), torch.arange(100, 164).view(64, 1))
    whole = dropout_mask.keep(7, P, *grid, torch.arange(-40, 60))
    pieces = torch.cat([dropout_mask.keep(7, P, *grid, keys) for keys in torch.arange(-40, 60).split(13)], -1)
    assert torch.equal(whole, pieces)


def test_another_seed_draws_another_mask_and_one_seed_the_same(monkeypatch):
    x, weight = _inputs(70)
    a = _grads(attn := _dropping(monkeypatch), attn, x, weight)
    _assert_same(_grads(attn, attn, x, weight), a)  # the seed, not the call, decides
    torch.testing.assert_close(_grads(attn, attn, x, weight)["out"], a["out"], rtol=0, atol=0)
    b = _grads(attn := _dropping(monkeypatch, seed=SEED + 1), attn, x, weight)
    assert (a["out"] - b["out"]).abs().max() > 1e-3
    grid = (torch.tensor(0), torch.arange(4).view(4, 1, 1), torch.arange(64).view(64, 1), torch.arange(64))
    differ = (dropout_mask.keep(SEED, P, *grid) != dropout_mask.keep(SEED + 1, P, *grid)).float().mean()
    assert 0.14 < differ < 0.22  # two independent masks differ on 2p(1 − p) = 0.18 of the logits


def test_p0_is_no_dropout_and_a_vanishing_p_runs_the_dropout_arithmetic_to_the_same_result(monkeypatch):
    x, weight = _inputs(70)
    attn = _dropping(monkeypatch, p=0.0)
    trained = _grads(attn, attn, x, weight)
    attn.eval()
    monkeypatch.setattr(attn, "_noise_seed", lambda: None)
    for key, value in _grads(attn, attn, x, weight).items():
        torch.testing.assert_close(trained[key], value, rtol=0, atol=0, msg=key)
    w, c, maps, inputs = _function_inputs(8, n_blocks=7)
    t = Tiling(w, c, 8, False, 0.4)
    plain = eva_attention(WholeSequence(t, maps=maps), *inputs)
    tiny = eva_attention(WholeSequence(dataclasses.replace(t, dropout=1e-12, seed=3), maps=maps), *inputs)
    torch.testing.assert_close(tiny, plain, rtol=0, atol=1e-10)  # two kernel calls per part, merged by ℓ and ℓ′
    assert dropout_mask.keep(3, 0.0, torch.tensor(0), torch.tensor(0), torch.arange(500).view(-1, 1), torch.arange(-50, 50)).all()


def test_eval_mode_applies_no_dropout(monkeypatch):
    attn = _dropping(monkeypatch).eval()
    x, weight = _inputs(70)
    _assert_same(_grads(attn, attn, x, weight), _grads(attn, lambda x: eva_per_token_torch(attn, x), x, weight))


def test_the_mask_drops_p_of_the_logits_independently():
    """Keep rate 1 − p; pairs of neighbouring rows, keys, heads and sequences, and token vs chunk
    keys of one number, both dropped at rate p² (independent), on 2·4·256·256 logits."""
    keep = dropout_mask.keep(SEED, P, torch.arange(2).view(2, 1, 1, 1), torch.arange(4).view(1, 4, 1, 1),
                             torch.arange(256).view(256, 1), torch.arange(256))
    dropped = (~keep).double()
    n = dropped.numel()
    assert abs(dropped.mean() - P) < 4 * (P * (1 - P) / n) ** 0.5
    for pair in (dropped[..., 1:] * dropped[..., :-1], dropped[..., 1:, :] * dropped[..., :-1, :],
                 dropped[:, 1:] * dropped[:, :-1], dropped[1:] * dropped[:-1]):
        assert abs(pair.mean() - P * P) < 5 * (P * P / pair.numel()) ** 0.5
    chunks = dropout_mask.keep(SEED, P, torch.arange(2).view(2, 1, 1, 1), torch.arange(4).view(1, 4, 1, 1),
                               torch.arange(256).view(256, 1), dropout_mask.chunk_key(torch.arange(256)))
    both = (dropped * (~chunks).double()).mean()
    assert abs(both - P * P) < 5 * (P * P / n) ** 0.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_kernel_mask_and_the_keep_decisions_are_one_mask(dtype):
    """`additive_of` (0 / −inf, what the fused kernel adds to its logits, built in scratch buffers)
    and `keep_of` (booleans: the plain path, the oracle) decide alike on every logit."""
    rows = dropout_mask.row_keys(SEED, torch.arange(2).view(2, 1, 1, 1), torch.arange(4).view(1, 4, 1, 1), torch.arange(300).view(-1, 1))
    keys = dropout_mask.key_keys(torch.arange(-40, 90))
    keep = dropout_mask.keep_of(rows, keys, P)
    scratch = (torch.empty(2 * 4 * 300 * 130 + 7, dtype=torch.int32), torch.empty(2 * 4 * 300 * 130 + 7, dtype=torch.int32))
    for buffers in (None, scratch):
        additive = dropout_mask.additive_of(rows, keys, P, dtype, buffers)
        assert additive.dtype == dtype
        assert torch.equal(additive, torch.where(keep, 0.0, float("-inf")).to(dtype))


@pytest.mark.parametrize("name", ["w16c4-t5", "w8c4-overlap-t5"])
def test_bf16_dropout_on_the_fused_path_within_bf16_of_the_float64_oracle(name, monkeypatch):
    """Under bf16 autocast the fused path with dropout keeps bf16 kernel inputs, and its output and
    every gradient stay within the bf16 tolerance of the float64 oracle replaying the mask."""
    _small_tiles(monkeypatch, rows=64)
    attn = _dropping(monkeypatch, **VARIANTS[name])
    x, weight = _inputs(160)
    want = _grads(attn, lambda x: eva_per_token_torch(attn, x, dropout=(SEED, P)), x, weight)
    low = _dropping(monkeypatch, **VARIANTS[name]).float()
    got, kernel_dtypes = _bf16_autocast_grads(monkeypatch, low, x, weight)
    assert torch.bfloat16 in kernel_dtypes
    for key in want:
        if want[key] is not None:
            error = _relative_error(got[key], want[key])
            assert error < 3e-2, (key, error)
    undropped = eva_per_token_torch(attn, x).detach()
    assert _relative_error(got["out"], undropped) > 3e-2  # the tolerance would not hide dropout switched off
