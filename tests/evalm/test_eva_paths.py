"""Which path an EVA call takes (evalm/eva_paths.py): decided in one place, visible under --debug.

The rule is checked fact by fact on `choose`; then real calls of `EvaAttention` (training,
scoring, a cache, forks over one parent) are run with EVALM_DEBUG=1 (what `evalm --debug` sets)
and the path each reports is the one the rule names. Whether each path computes EVA is the other
tests' business (test_eva.py, test_recompute.py, test_oracles_long.py).
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from evalm import eva_paths
from evalm.eva_paths import EvaCall, Route, choose
from tests.evalm.paths import PLAIN, TILES, forced
from tests.evalm.test_eva import make_attention, make_model, tokens

TRAINING = EvaCall(whole=True, kernel=True, dropout=False, grad=True, full_precision=True, one_tile_per_group=False, forks=False)
SCORING = EvaCall(whole=False, kernel=True, dropout=False, grad=False, full_precision=True, one_tile_per_group=True, forks=False)


@pytest.mark.parametrize("facts, route", [
    ({}, Route.FUSED),
    ({"dropout": True}, Route.FUSED),  # the paper's attention dropout keeps the kernel
    ({"dropout": True, "full_precision": False}, Route.FUSED),  # bf16 too
    ({"kernel": False}, Route.RECOMPUTE),
    ({"kernel": False, "dropout": True}, Route.RECOMPUTE),
    ({"whole": False}, Route.TILES),  # a cache in training: autograd through tiles
    ({"flex": True}, Route.FLEX),  # a GPU: one flex_attention call, before the CPU kernel
    ({"flex": True, "dropout": True}, Route.FLEX),
    ({"flex": True, "sink": True}, Route.FLEX),  # the flex route reads sink tokens, moved or not
    ({"flex": True, "whole": False}, Route.TILES),  # a cache on a GPU: the tiles
    ({"sink": True}, Route.TILES),  # no flex: only the tiles read sink tokens
])
def test_a_whole_sequence_takes_the_kernel_unless_the_device_forbids(facts, route):
    path = choose(dataclasses.replace(TRAINING, **facts))
    assert path.route is route and not path.split and path.reason
    assert path.route.whole == (route is not Route.TILES) and path.name == route.value
    assert ("dropout" in path.reason) == (route in (Route.FUSED, Route.FLEX) and facts.get("dropout", False))


@pytest.mark.parametrize("facts, route", [
    ({}, Route.FUSED),  # training and one-shot scoring: the fused path's selected part (evalm/flash_selection.py)
    ({"grad": False}, Route.FUSED),
    ({"full_precision": False}, Route.FUSED),
    ({"dropout": True}, Route.TILES),  # what the fused selection does not read: the tiles
    ({"sink": True}, Route.TILES),
    ({"select_moved": True}, Route.TILES),
    ({"kernel": False}, Route.TILES),
    ({"flex": True, "kernel": False}, Route.TILES),  # no flex form yet
    ({"whole": False}, Route.TILES),
])
def test_a_whole_sequence_with_selection_takes_the_fused_path_where_it_reads_everything(facts, route):
    path = choose(dataclasses.replace(TRAINING, select=True, new_tokens=4096, **facts))
    assert path.route is route and path.reason and not path.split
    assert not path.kernel  # the tiles' kernel form is for calls without a graph; these have one, or are fused


@pytest.mark.parametrize("facts, route, split", [
    ({}, Route.TILES, True),
    ({"forks": True}, Route.FORKS, True),
    ({"grad": True}, Route.TILES, False),  # a graph needs the one-mask path
    ({"dropout": True}, Route.TILES, False),
    ({"full_precision": False}, Route.TILES, False),
    ({"one_tile_per_group": False}, Route.TILES, False),
    ({"forks": True, "grad": True}, Route.FORKS, False),
])
def test_a_cached_call_splits_its_softmax_only_without_graph_dropout_or_low_precision(facts, route, split):
    path = choose(dataclasses.replace(SCORING, **facts))
    assert (path.route, path.split) == (route, split)
    assert path.name == route.value + ("-split" if split else "")  # the name is printed, never parsed


def _reported(capsys) -> list[str]:
    return re.findall(r"EVA layer (\d+): path (\S+) \(", capsys.readouterr().err)


@pytest.fixture
def debug(monkeypatch):
    monkeypatch.setenv("EVALM_DEBUG", "1")


def test_debug_names_the_path_of_each_real_call(debug, capsys):
    model = make_model(attn_dropout=0.1)
    x = tokens(40, batch=2)
    model.train()
    model(x[:, :-1], targets=x[:, 1:]).backward()
    assert _reported(capsys) == [("0", "fused"), ("1", "fused")]  # the paper's attention dropout on the kernel
    model.eval()
    with forced(**PLAIN):
        model(x[:, :-1], targets=x[:, 1:]).backward()
    assert _reported(capsys) == [("0", "recompute"), ("1", "recompute")]
    with torch.no_grad():
        parent = model.new_cache()
        model(tokens(48), cache=parent)
        assert ("0", "tiles-split") in _reported(capsys)  # 48 tokens: one 64-row tile
        model(tokens(3, batch=3), cache=parent.fork(batch_size=3))  # completing no chunk: all share the parent's
        assert _reported(capsys) == [("0", "forks-split"), ("1", "forks-split")]
    model(tokens(9), cache=model.new_cache())  # a graph through a cache
    assert _reported(capsys) == [("0", "tiles"), ("1", "tiles")]
    model(tokens(9), cache=model.new_cache())
    assert _reported(capsys) == []  # once per layer and path
    make_model()(tokens(9), cache=make_model().new_cache())
    assert _reported(capsys) == [("0", "tiles"), ("1", "tiles")]  # another model's layers say theirs


def test_without_debug_nothing_is_printed(monkeypatch, capsys):
    monkeypatch.delenv("EVALM_DEBUG", raising=False)
    model = make_model()
    model(tokens(20))
    assert capsys.readouterr().err == ""


def test_tests_pin_paths_through_the_facts_not_through_switches_on_the_module(debug, capsys):
    attn = make_attention()
    assert not {"recompute", "fused", "group_logits"} & set(vars(attn))
    x = torch.randn(1, 40, 32, dtype=torch.float64)
    for facts, name in (({}, "fused"), (PLAIN, "recompute"), (TILES, "tiles-split")):
        with torch.no_grad(), forced(**facts):
            attn(x)
        assert _reported(capsys) == [("0", name)]
