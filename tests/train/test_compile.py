"""`train.compile` on the CPU (train/parallelize.py `apply_compile`): blocks compiled as training compiles
them, on the GPU route (forced here: its forward compiles on the CPU too, evalm/flex.py), serve several
sequence lengths and equal the same blocks run eagerly. At a second length dynamo's automatic dynamic
shapes would recompile with symbolic lengths, which the route's lowering does not take (an
InductorError): the blocks are compiled with static shapes, one graph per length.

    python -m pytest tests/train/test_compile.py -q
"""

from __future__ import annotations

import torch

from evalm import ModelConfig
from tests import models
from tests.evalm.paths import forced, recorded
from train.parallelize import apply_compile

CONFIG = ModelConfig(vocab_size=61, d_model=64, n_layer=2, n_head=4, d_ff=64, window_size=16, chunk_size=4,
                     circular_period=4096, dropout=0.0, attn_dropout=0.0, attention="eva", overlap_window=True,
                     use_t5_bias=True, sink_tokens=8)


UNTRACED = ("_noise_seed", "_eager_slot_tensors", "block_mask")  # run eagerly on purpose (evalm/flex.py, evalm/eva.py)


def test_compiled_blocks_serve_several_lengths_and_equal_the_eager_blocks():
    counters = torch._dynamo.utils.counters
    counters.clear()
    eager = models.visible_model(CONFIG, seed=2).eval()
    compiled = models.visible_model(CONFIG, seed=2).eval()
    apply_compile(compiled)
    assert all(hasattr(block, "_compiled_call_impl") and block._compiled_call_impl is not None for block in compiled.blocks)
    generator = torch.Generator().manual_seed(0)
    for n in (300, 384):  # 384: a second length, a recompilation
        tokens = torch.randint(CONFIG.vocab_size, (2, n), generator=generator)
        with torch.no_grad(), forced(flex=True), recorded() as taken:
            want = eager(tokens)
        with torch.no_grad(), forced(flex=True):
            got = compiled(tokens)
        assert {p.name for p in taken} == {"flex"}
        assert ((got - want).norm() / want.norm()).item() < 1e-5, n
    breaks = counters["graph_break"]  # each one at a function run eagerly on purpose, none elsewhere
    assert breaks and all(any(name in reason for name in UNTRACED) for reason in breaks), list(breaks)
