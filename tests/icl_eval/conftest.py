"""Tiny models and prompts for the ICL evaluator tests (CPU, float32 unless stated).

Run: python -m pytest tests/icl_eval -x -q
"""

from __future__ import annotations

import pytest
import torch

from evalm import ModelConfig
from evalm.text.tokenizer import ByteTokenizer
from evalm.icl_eval.models.lm import EvalmLM
from evalm.icl_eval.tasks.prompts import PromptBuilder
from evalm.icl_eval.tasks.synthetic import SyntheticConfig, episode, synthetic_task
from tests.models import visible_model


def tiny_evalm(attention: str, seed: int = 0, dtype=torch.float32) -> EvalmLM:
    cfg = ModelConfig(vocab_size=257, d_model=32, n_layer=2, n_head=4, d_ff=64, window_size=16, chunk_size=4,
                      circular_period=4096, attention=attention, dropout=0.0, attn_dropout=0.0)
    return EvalmLM(visible_model(cfg, seed).to(dtype).eval(), ByteTokenizer())


@pytest.fixture
def one_thread():
    """Tiny matmuls run several times faster on one thread than on two shared cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(params=["eva", "full"])
def lm(request) -> EvalmLM:
    """float64, so that the 1e-6 bound of the exactness tests has a wide margin over rounding
    (in float32 the same comparisons differ by ~1 ulp of a score near 12, i.e. ~1e-6)."""
    return tiny_evalm(request.param, dtype=torch.float64)


@pytest.fixture
def synth():
    """(prompt builder, episode splits) of the synthetic task with byte tokens."""
    cfg = SyntheticConfig()
    return PromptBuilder(synthetic_task(cfg), ByteTokenizer()), episode(0, cfg)


def demos_and_items(prompt, splits, n_demos: int, n_items: int = 3):
    demos = [prompt.demo(i, splits["train"][i]) for i in range(n_demos)]
    items = [prompt.test_item(i, splits["test"][i], n_demos) for i in range(n_items)]
    return demos, items


def save_tiny_gpt2(folder, n_positions: int = 256):
    """A tiny random GPT-2 (byte vocabulary, eos 256) saved to `folder`; no download."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=257, n_positions=n_positions, n_embd=32, n_layer=2, n_head=4,
                                     bos_token_id=256, eos_token_id=256)
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():  # larger weights than GPT-2's init so attention is far from uniform
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    model.save_pretrained(folder)
    return folder
