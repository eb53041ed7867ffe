"""The FLOP count behind MFU (train/metrics.py): attention's keys per query and the parameters in products.

The oracle for EVA's keys is the equation's visibility matrices of tests/evalm/test_eva_sink.py
(local, sink and remote, counted densely), not the rule the code reads.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from evalm import EvalmModel, ModelConfig
from evalm.train.metrics import attention_keys, flops_per_token, matmul_params
from evalm.tiling import Ablation
from tests.evalm.test_eva_sink import visibility

SMALL = ModelConfig(vocab_size=50, d_model=32, n_layer=2, n_head=4, d_ff=64, window_size=8, chunk_size=4,
                    circular_period=64, attention="eva")


@pytest.mark.parametrize("changes", [{}, {"overlap_window": True}, {"exclude_window_chunks": True},
                                     {"sink_tokens": 4, "overlap_window": True}, {"attention": "window"}])
def test_keys_per_query_are_the_equations_visible_keys(changes):
    config = dataclasses.replace(SMALL, **changes)
    eva = EvalmModel(dataclasses.replace(config, attention="eva")).blocks[0].attn
    T = 203
    ablation = Ablation.NO_REMOTE if config.attention == "window" else Ablation.NONE
    local, sunk, remote = visibility(eva, T, config.sink_tokens, ablation)
    want = (local.sum() + sunk.sum() + remote.sum()).item() / T
    assert attention_keys(config, T) == pytest.approx(want, rel=1e-12)
    assert attention_keys(dataclasses.replace(config, attention="full", sink_tokens=0), T) == (T + 1) / 2


def test_flops_are_6n_plus_attentions_own_and_eva_counts_fewer_keys():
    T = 8192
    full = flops_per_token(1000, dataclasses.replace(SMALL, attention="full"), T)
    eva = flops_per_token(1000, SMALL, T)
    assert full["total"] == 6000 + 12 * 2 * 32 * (T + 1) / 2  # 6 L E (T + 1): PaLM's causal term
    assert eva["params"] == 6000 and eva["attention"] < full["attention"] / 3.5  # about w/2 + n/(2c) of n/2 keys
    assert eva["total"] == eva["params"] + eva["attention"]


def test_parameters_in_products_are_the_linear_weights_with_a_tied_output_matrix_once():
    tied = EvalmModel(SMALL)
    untied = EvalmModel(dataclasses.replace(SMALL, tie_embeddings=False))
    E, F, V, D = SMALL.d_model, SMALL.d_ff, SMALL.vocab_size, SMALL.head_dim
    per_block = 4 * E * E + 2 * E * F + 2 * D * D
    assert matmul_params(tied) == SMALL.n_layer * per_block + V * E  # q, k, v, out, fc1, fc2, A_q, A_k; LM head
    assert matmul_params(untied) == matmul_params(tied)  # untied: the token table is a lookup, the head the same size


def test_torchtitans_count_credits_every_query_with_all_t_keys():
    """torchtitan's `get_num_flop_per_token`: 6N + 12·L·H·Q·T, written out by hand for L 2, H 4, Q 8,
    T 100 (E = H·Q = 32), beside the causal-aware count of the same shape; the same for EVA (the
    count does not read the attention kind)."""
    T, N = 100, 1000
    want = 6 * N + 12 * 2 * 4 * 8 * 100  # 6,000 + 76,800
    full = flops_per_token(N, dataclasses.replace(SMALL, attention="full"), T)
    assert full["torchtitan"] == want == 82800
    assert full["total"] == 6 * N + 12 * 2 * 32 * 50.5  # (T + 1)/2 keys: 44,784
    assert flops_per_token(N, SMALL, T)["torchtitan"] == want
