"""The GPU route's kernel cannot silently degrade (evalm/flex_kernel.py), on the CPU, where
flex_attention's forward compiles too:
- past the recompile limit a call raises `KernelUnavailable` instead of running flex's dense eager
  reference (which holds every score), and the process's dynamo settings stay as they were;
- lengths in one bucket of 128 share one compiled kernel, each exact at its own length;
- a kernel that does not compile (here: inductor given a C++ compiler that does not exist) raises
  `KernelUnavailable`, and the device type is remembered (`compiles_on`, so `flex.usable_on`);
- an EVA layer on the route answers either with the `recompute` route and one warning that says
  why: its output equals the route's own eager reference.

    python -m pytest tests/evalm/test_flex_kernel.py -q
"""

from __future__ import annotations

import pytest
import torch
import torch._inductor.config as inductor_config

from evalm import flex, flex_kernel
from tests.evalm.paths import forced
from tests.evalm.test_eva_sink import heads, model

BROKEN_COMPILER = {"cpp.cxx": ("/nonexistent/g++",)}  # inductor's C++ compiler: a path with nothing there


@pytest.fixture
def fresh(monkeypatch):
    """Dynamo's caches emptied (other tests' shapes count towards the limit) and the process's
    memory of failed devices kept apart from theirs."""
    torch._dynamo.reset()
    monkeypatch.setattr(flex_kernel, "_NOT_COMPILING", {})
    yield
    torch._dynamo.reset()


def layer_and_heads(n: int):
    m = model(overlap_window=True, use_t5_bias=True, window_size=16, chunk_size=4).float().eval()
    attn = m.blocks[0].attn
    with torch.no_grad():
        q, k, v = heads(attn, torch.randn(1, n, m.config.d_model))
    return attn, flex.LayerParts(attn.layout, attn.maps, attn.rel_pos_bias, None), (q.float(), k.float(), v.float())


def test_past_the_recompile_limit_a_call_is_refused_not_run_densely(fresh, monkeypatch):
    monkeypatch.setattr(flex_kernel, "RECOMPILE_LIMIT", 2)
    kernel = flex_kernel.with_recompile_limit(torch.compile(flex_kernel.module()[0].flex_attention, dynamic=False))
    before = (torch._dynamo.config.recompile_limit, torch._dynamo.config.fail_on_recompile_limit_hit)
    with torch.no_grad():
        for n in (130, 260):  # two lengths, two kernels: within the limit
            _, layer, qkv = layer_and_heads(n)
            flex.attend_layer(layer, *qkv, kernel=kernel)
        _, layer, qkv = layer_and_heads(390)
        with pytest.raises(flex_kernel.KernelUnavailable, match="compiled flex_attention 2 times"):
            flex.attend_layer(layer, *qkv, kernel=kernel)
    assert (torch._dynamo.config.recompile_limit, torch._dynamo.config.fail_on_recompile_limit_hit) == before


def test_the_lengths_of_a_bucket_share_one_kernel_and_stay_exact(fresh, monkeypatch):
    """Lengths are padded to a multiple of 128 (evalm/flex.py `attend_layer`): with room for one compiled
    kernel, 130, 200 and 256 tokens all run it, each equal to the eager reference at its own length;
    300 tokens, the next bucket, needs a second kernel."""
    monkeypatch.setattr(flex_kernel, "RECOMPILE_LIMIT", 1)
    kernel = flex_kernel.with_recompile_limit(torch.compile(flex_kernel.module()[0].flex_attention, dynamic=False))
    with torch.no_grad():
        for n in (130, 200, 256):
            _, layer, qkv = layer_and_heads(n)
            got, want = flex.attend_layer(layer, *qkv, kernel=kernel), flex.attend_layer(layer, *qkv)
            assert got.shape == qkv[0].shape and ((got - want).norm() / want.norm()).item() < 1e-5, n
        _, layer, qkv = layer_and_heads(300)
        with pytest.raises(flex_kernel.KernelUnavailable):
            flex.attend_layer(layer, *qkv, kernel=kernel)


def test_a_kernel_that_does_not_compile_is_refused_and_remembered(fresh):
    _, layer, qkv = layer_and_heads(130)
    assert flex_kernel.compiles_on(torch.device("cpu"))
    with torch.no_grad(), inductor_config.patch(BROKEN_COMPILER):
        with pytest.raises(flex_kernel.KernelUnavailable, match="did not compile on cpu"):
            flex.attend_layer(layer, *qkv, kernel=flex_kernel.compiled())
    assert not flex_kernel.compiles_on(torch.device("cpu"))
    assert flex_kernel.compiles_on(torch.device("cuda"))  # per device type


def test_an_eva_layer_answers_with_the_recompute_route_and_says_why(fresh, monkeypatch):
    attn, layer, (q, k, v) = layer_and_heads(130)
    with torch.no_grad():
        want = flex.attend_layer(layer, q, k, v)  # the route's eager reference
    # the compiled kernel on the CPU, as on a GPU, with a compiler that cannot build it
    monkeypatch.setattr(flex_kernel, "for_device", lambda device: flex_kernel.compiled())
    with torch.no_grad(), forced(flex=True), inductor_config.patch(BROKEN_COMPILER):
        with pytest.warns(RuntimeWarning, match="falls back to the recompute route.*did not compile on cpu"):
            got = attn.attend(q, k, v)
    assert ((got - want).norm() / want.norm()).item() < 1e-5
