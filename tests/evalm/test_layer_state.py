"""The per-layer cache state protocol (evalm/cache.py `LayerState`) and the attention registry.

EVA's and exact attention's states must satisfy the protocol; and a third attention variant whose
state has nothing but the protocol's three members, registered by one entry in `ATTENTION`, must
run every cache operation (segments, forks, a batch of forks, merge, nbytes) and give exact
attention's results: the oracle is `FullAttention` with the same weights, and the third variant
computes the same softmax its own way (one dense masked softmax over all keys), in float64.
"""

from __future__ import annotations

import dataclasses
import inspect
import math

import pytest
import torch
from torch import Tensor

from evalm import EvalmModel, ModelConfig
from evalm.attention import ATTENTION
from evalm.cache import Cache, LayerState, merge
from evalm.eva import EvaState
from evalm.full_attention import FullState
from evalm.heads import HeadProjections

EXACT = 1e-10  # float64: sums reassociated, nothing else
BASE = ModelConfig(vocab_size=61, d_model=32, n_layer=2, n_head=4, d_ff=64, window_size=16, chunk_size=4,
                   circular_period=40, dropout=0.0, attn_dropout=0.0, attention="eva")


def tokens(n: int, batch: int = 1, seed: int = 2) -> Tensor:
    return torch.randint(0, BASE.vocab_size, (batch, n), generator=torch.Generator().manual_seed(seed))


def make_model(attention: str) -> EvalmModel:
    torch.manual_seed(0)
    model = EvalmModel(dataclasses.replace(BASE, attention=attention))
    model.init_weights()
    return model.double().eval()


class MinimalState:
    """The least a layer state can be: its K/V and the protocol's three members, nothing else."""

    def __init__(self, k: Tensor, v: Tensor):
        self.k, self.v = k, v

    def entries(self) -> tuple[Tensor, Tensor]:
        return self.k, self.v

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v))

    def disowned(self) -> MinimalState:
        return self  # whole tensors, never grown in place: nothing to disown


class MinimalAttention(HeadProjections):
    """Exact causal attention by one dense masked softmax over [merged prefix; cached K/V; own K/V]."""

    def init_weights(self) -> None:
        self.init_projections()

    def forward(self, x: Tensor, cache: Cache | None = None) -> Tensor:
        q, k, v = self.qkv(x)
        B, H, T, D = q.shape
        state = cache.layers[self.layer_idx] if cache is not None else None
        if state is not None:
            k = torch.cat([state.k.expand(B, -1, -1, -1), k], -2)
            v = torch.cat([state.v.expand(B, -1, -1, -1), v], -2)
        n_old = k.shape[-2] - T
        visible = torch.arange(n_old + T)[None, :] <= n_old + torch.arange(T)[:, None]
        logits = (q @ k.transpose(-1, -2) * D**-0.5).masked_fill(~visible, float("-inf"))
        keys_v = v
        if cache is not None:
            logits = logits + cache.own_logit_bias
            prefix = cache.prefix[self.layer_idx]
            if prefix is not None:
                logits = torch.cat([q @ prefix[0].transpose(-1, -2) * D**-0.5, logits], -1)
                keys_v = torch.cat([prefix[1].expand(B, -1, -1, -1), v], -2)
            cache.layers[self.layer_idx] = MinimalState(k, v)
        return self.merge(torch.softmax(logits, -1) @ keys_v)


def test_protocol_declares_what_the_cache_calls():
    """The protocol's members are exactly the three the cache (and train/structure.py) call."""
    members = {n for n, _ in inspect.getmembers(LayerState, inspect.isfunction)} - set(dir(object))
    assert members == {"entries", "nbytes", "disowned"}


@pytest.mark.parametrize("attention, state_type", [("eva", EvaState), ("full", FullState)])
def test_eva_and_full_states_satisfy_the_protocol(attention, state_type):
    model = make_model(attention)
    cache = model.new_cache()
    with torch.no_grad():
        model(tokens(23), cache=cache)
    for state in cache.layers:
        assert type(state) is state_type and isinstance(state, LayerState)
        k, v = state.entries()
        assert k.shape == v.shape and k.shape[:2] == (1, BASE.n_head) and k.shape[-1] == BASE.head_dim
        assert state.nbytes() >= k.numel() * k.element_size()  # at least what a later token attends to
        child = state.disowned()
        assert type(child) is state_type and child.n_owned == 0 and state.n_owned > 0
        assert all(torch.equal(a, b) for a, b in zip(child.entries(), state.entries()))
    assert isinstance(MinimalState(k, v), LayerState)
    assert not isinstance(object(), LayerState)  # the check is not vacuous


def test_attention_names_are_the_registry(monkeypatch):
    """Config validation and the model read one dict: a new entry is a valid name and gets built."""
    with pytest.raises(ValueError, match=r"attention='minimal' is not known; valid: \['eva', 'full', 'window'\]"):
        ModelConfig(attention="minimal")
    monkeypatch.setitem(ATTENTION, "minimal", f"{__name__}:MinimalAttention")
    model = EvalmModel(dataclasses.replace(BASE, attention="minimal"))
    assert all(type(block.attn) is MinimalAttention for block in model.blocks)


def test_cache_with_a_minimal_third_state_equals_exact_attention(monkeypatch):
    monkeypatch.setitem(ATTENTION, "minimal", f"{__name__}:MinimalAttention")
    full = make_model("full")
    minimal = EvalmModel(dataclasses.replace(BASE, attention="minimal")).double().eval()
    minimal.load_state_dict(full.state_dict(), strict=True)  # the same parameter names: one projection class
    x, tails = tokens(21), tokens(6, batch=3, seed=5)
    results = {}
    with torch.no_grad():
        for name, model in (("full", full), ("minimal", minimal)):
            parent = model.new_cache()
            first = torch.cat([model(x[:, :9], cache=parent), model(x[:, 9:], cache=parent)], 1)  # segments
            kids = parent.fork(batch_size=3)
            batch = model(tails, cache=kids)
            child = parent.fork()
            again = model(x[:, :4], cache=child)
            after = model(x[:, 4:8], cache=parent)  # the parent continues as if never forked
            groups = [model.new_cache() for _ in range(2)]
            for g, seg in zip(groups, (x[:, :7], x[:, 7:15])):
                model(seg, cache=g)
            merged = merge(groups, own_logit_bias=math.log(2), position_offset=15)
            test = model(x[:, 15:], cache=merged)
            results[name] = (first, batch, again, after, test, torch.tensor(float(parent.nbytes())))
    for got, want in zip(results["minimal"], results["full"]):
        torch.testing.assert_close(got, want, rtol=0, atol=EXACT)
    # nbytes is the states' own: the minimal state reports its K/V, as full attention's does
    assert results["minimal"][-1] == results["full"][-1] > 0
