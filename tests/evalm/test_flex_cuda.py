"""The GPU route of EVA (`flex`, evalm/flex.py) on a GPU: the compiled kernel's forward and backward.

    python -m pytest -m cuda tests/evalm/test_flex_cuda.py -q     # on a machine with CUDA

Skipped without CUDA (CI has none; `benchmarks/gpu.py` runs them on the device machine and puts
their result in its report). Against the float64 equation of tests/evalm/test_eva_sink.py on the
CPU, from the same weights and inputs:
- fp32, forward and every gradient (q, k, v, A_q/A_k, the T5 table): ‖got − want‖/‖want‖ ≤ FP32
  (IEEE fp32 arithmetic, no TF32), for overlap + T5 + excluded window chunks, moved sink tokens,
  and attention dropout with the summaries' noise ε (drawn where the route draws it: the GPU);
- bf16 inputs at the paper's rule (w 128, c 8, D 64): ≤ BF16 for the output and the gradients;
- attention dropout drops what the fused CPU route drops for one seed: the same call's output on
  both devices;
- incremental encoding on CUDA (the tiles) equals the one-shot forward (the flex route), and a
  batch of forks equals each continuation encoded whole.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from evalm import EvalmModel, ModelConfig, flex, whole_sequence
from tests import models
from tests.evalm.paths import recorded
from tests.evalm.test_eva_sink import heads, move, oracle

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
DEVICE = "cuda"
FP32 = 1e-4  # IEEE fp32 sums over a few hundred keys, relative to the norm
BF16 = 2e-2  # bf16 inputs (8 bits of mantissa) and bf16 k̃, β, outputs; fp32 softmax inside
LAYER = ModelConfig(vocab_size=61, d_model=64, n_layer=1, n_head=4, d_ff=64, window_size=16, chunk_size=4,
                    circular_period=4096, dropout=0.0, attn_dropout=0.0, attention="eva")  # head dim 16
VARIANTS = {
    "overlap-t5-exclude": ({"overlap_window": True, "use_t5_bias": True, "exclude_window_chunks": True}, False),
    "sink-16-moved": ({"sink_tokens": 16}, True),
}


@pytest.fixture(autouse=True)
def ieee_fp32():
    """fp32 products in IEEE arithmetic (the kernel follows PyTorch's matmul precision setting)."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double().cpu() - want).norm() / want.norm()).item()


def layers(changes: dict, moved: bool):
    """(oracle layer float64 on the CPU, route layer fp32 on the GPU) with equal weights."""
    cpu = models.visible_model(dataclasses.replace(LAYER, **changes), seed=1).double().eval()
    dev = models.visible_model(dataclasses.replace(LAYER, **changes), seed=1).to(DEVICE).float().eval()
    a, b = cpu.blocks[0].attn, dev.blocks[0].attn
    b.sink_shift = move if moved else None
    return a, b


def grads_of(attn, q, k, v, weight, out) -> list[torch.Tensor]:
    params = [*attn.adaptive_mu_q.parameters(), *attn.adaptive_mu_k.parameters(),
              *(attn.rel_pos_bias.parameters() if attn.rel_pos_bias is not None else ())]
    return list(torch.autograd.grad((out * weight).sum(), [q, k, v, *params]))


@pytest.mark.parametrize("variant", VARIANTS)
def test_fp32_forward_and_backward_equal_the_equation(variant):
    changes, moved = VARIANTS[variant]
    cpu, dev = layers(changes, moved)
    S = changes.get("sink_tokens", 0)
    x = torch.randn(2, 300, LAYER.d_model, dtype=torch.float64)  # 3 row tiles, the last cut short
    weight = torch.randn(2, 300, LAYER.n_head, LAYER.d_model // LAYER.n_head, dtype=torch.float64)
    with torch.no_grad():
        q, k, v = heads(cpu, x)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    want_out = oracle(cpu, q, k, v, S, move=move if moved else None)
    want = grads_of(cpu, q, k, v, weight, want_out)
    qd, kd, vd = (t.detach().to(DEVICE).float().requires_grad_() for t in (q, k, v))
    with recorded() as taken:
        out = dev.attend(qd, kd, vd)
    got = grads_of(dev, qd, kd, vd, weight.to(DEVICE).float(), out)
    assert {p.name for p in taken} == {"flex"}
    errors = [rel(out, want_out.detach()), *(rel(g, w) for g, w in zip(got, want))]
    assert max(errors) < FP32, errors


def test_fp32_attention_dropout_and_noise_equal_the_equation():
    """Training mode: the dropout seed and ε's seed come from torch's RNG in the layer's order; the
    oracle replays the keep mask (evalm/dropout_mask.py) and draws ε on the GPU, as the route does."""
    changes = {"overlap_window": True, "use_t5_bias": True, "exclude_window_chunks": True, "sink_tokens": 8, "attn_dropout": 0.3}
    cpu, dev = layers(changes, True)
    dev.train()
    x = torch.randn(2, 300, LAYER.d_model, dtype=torch.float64)
    weight = torch.randn(2, 300, LAYER.n_head, LAYER.d_model // LAYER.n_head, dtype=torch.float64)
    with torch.no_grad():
        q, k, v = heads(cpu, x)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    qd, kd, vd = (t.detach().to(DEVICE).float().requires_grad_() for t in (q, k, v))
    torch.manual_seed(11)
    out = dev.attend(qd, kd, vd)
    got = grads_of(dev, qd, kd, vd, weight.to(DEVICE).float(), out)
    torch.manual_seed(11)
    seeds = [int(torch.randint(0, 2**62, (1,))) for _ in range(2)]  # EvaAttention._tiling's order
    like = torch.empty((), dtype=torch.float32, device=DEVICE)  # ε as the route draws it: like ω, on the GPU
    want_out = oracle(cpu, q, k, v, 8, move=move, training=(seeds[0], 0.3, seeds[1], like))
    want = grads_of(cpu, q, k, v, weight, want_out)
    errors = [rel(out, want_out.detach()), *(rel(g, w) for g, w in zip(got, want))]
    assert torch.isfinite(out).all() and max(errors) < FP32, errors


def test_bf16_at_the_papers_rule_within_the_stated_bound():
    """w 128, c 8, D 64, 1,100 tokens (9 row tiles): bf16 q, k, v straight from N(0, 1) (logits of
    order 1, as a trained model's), the layer's maps in fp32."""
    config = dataclasses.replace(LAYER, d_model=256, n_head=4, window_size=128, chunk_size=8)
    torch.manual_seed(2)
    cpu = EvalmModel(config).double().eval()
    cpu.init_weights()
    dev = EvalmModel(config).to(DEVICE).eval()
    dev.load_state_dict(cpu.state_dict())
    a, b = cpu.blocks[0].attn, dev.blocks[0].attn
    shape = (1, 1100, 4, 64)
    q, k, v = (torch.randn(shape, dtype=torch.float64).bfloat16().double().requires_grad_() for _ in range(3))
    weight = torch.randn(shape, dtype=torch.float64)
    want_out = oracle(a, q, k, v, 0)
    want = grads_of(a, q, k, v, weight, want_out)
    qd, kd, vd = (t.detach().to(DEVICE).bfloat16().requires_grad_() for t in (q, k, v))
    out = b.attend(qd, kd, vd)
    got = grads_of(b, qd, kd, vd, weight.to(DEVICE).bfloat16(), out)
    errors = [rel(out, want_out.detach()), *(rel(g, w) for g, w in zip(got, want))]
    assert out.dtype == torch.bfloat16 and max(errors) < BF16, errors


def test_dropout_drops_what_the_fused_cpu_route_drops():
    """One call's `Tiling` (rate 0.3, one seed, no ε) through the GPU route and through the fused CPU
    route (evalm/whole_sequence.py): the same keep decisions give the same output."""
    cpu, dev = layers({"overlap_window": True, "use_t5_bias": True, "exclude_window_chunks": True}, False)
    cpu.float()
    t = dataclasses.replace(cpu.layout, dropout=0.3, seed=123456789)
    with torch.no_grad():
        q, k, v = heads(cpu, torch.randn(2, 300, LAYER.d_model, dtype=torch.float32))
        got = flex.attend_layer(flex.LayerParts(t, dev.maps, dev.rel_pos_bias, None), *(x.to(DEVICE) for x in (q, k, v)))
        w = cpu.window_size
        distance = torch.arange(w)[:, None] + cpu.ext - torch.arange(cpu.ext + w)
        bias = t.scale * cpu.rel_pos_bias(distance.clamp(min=0))
        call = whole_sequence.WholeSequence(t, whole_sequence.FUSED, cpu.maps)
        want = whole_sequence.eva_attention(call, q.clone(), k.clone(), v.clone(), bias)
        undropped = whole_sequence.eva_attention(dataclasses.replace(call, t=dataclasses.replace(t, dropout=0.0)),
                                                 q.clone(), k.clone(), v.clone(), bias)
    assert rel(got, want.double()) < FP32
    assert rel(got, undropped.double()) > 0.1  # the mask is read


def test_incremental_encoding_on_cuda_equals_the_one_shot_forward():
    config = dataclasses.replace(LAYER, n_layer=2, vocab_size=97)
    model = models.visible_model(config, seed=3).to(DEVICE).eval()
    tokens = torch.randint(0, 97, (2, 530), generator=torch.Generator().manual_seed(4)).to(DEVICE)
    with torch.no_grad(), recorded() as taken:
        whole = model(tokens)
        cache, parts = model.new_cache(batch_size=2), []
        for lo, hi in ((0, 7), (7, 200), (200, 201), (201, 530)):
            parts.append(model(tokens[:, lo:hi], cache=cache))
        trunk = model.new_cache()
        model(tokens[:1, :500], cache=trunk)
        tails = tokens[:, 500:512].repeat(2, 1)[:3]
        forked = model(tails, cache=trunk.fork(batch_size=3))
        each = [model(torch.cat([tokens[:1, :500], tails[b : b + 1]], 1))[:, 500:] for b in range(3)]
    names = {p.name for p in taken}
    assert "flex" in names and names & {"tiles", "tiles-split"}
    assert rel(torch.cat(parts, 1), whole.double().cpu()) < FP32
    assert rel(forked, torch.cat(each).double().cpu()) < FP32
