"""The GPU route of EVA (`flex`, evalm/flex.py) on a GPU: the compiled kernel's forward and backward.

    python -m pytest -rA -m cuda tests/evalm/test_flex_cuda.py     # on a machine with CUDA

Skipped without CUDA (CI has none). The device run (scripts/device_run.sh, launcher/device_run.py)
runs them first, each under a timeout, and records every test's outcome and time: the GPU figures
count only where all of them passed at the same commit. Against the float64 equation of tests/evalm/test_eva_sink.py on the
CPU, from the same weights and inputs:
- fp32, forward and every gradient (q, k, v, A_q/A_k, the T5 table): ‖got − want‖/‖want‖ ≤ FP32
  (IEEE fp32 arithmetic, no TF32), for overlap + T5 + excluded window chunks, moved sink tokens,
  and attention dropout with the summaries' noise ε (drawn where the route draws it: the GPU);
- bf16 inputs at the paper's rule (w 128, c 8, D 64): ≤ BF16 for the output and the gradients;
- attention dropout drops what the fused CPU route drops for one seed: the same call's output on
  both devices;
- incremental encoding on CUDA (the tiles) equals the one-shot forward (the flex route), and a
  batch of forks equals each continuation encoded whole;
- the kernel compiled (the route as it runs; the slots eager) and both eager
  (`torch.compiler.set_stance("force_eager")`): each equals the equation, forward and gradients
  (the T5 table's in the compiled stance: flex's eager reference does not differentiate it);
- a block compiled whole (`train.compile`) at 300 tokens equals the float64 block, gradients included;
- at a benchmarked shape (8,192 tokens, batch 2, 16 heads of 64, bf16, w 128, c 8) the route equals
  the plain-PyTorch `recompute` route in fp32 on the same bf16 inputs within BF16, forward and the
  gradients of q, k, v;
- rows whose every key is dropped (attention dropout 0.9: the first rows see one or two keys) give
  zero rows and finite gradients, equal to the fused CPU route's, forward and backward;
- the T5 bias table's gradient equals the equation's on several row tiles, and is not zero;
- nine lengths in one process (past dynamo's default of eight compilations of one function) each
  equal the `recompute` route, and the longest (4,100 tokens) runs in the kernel, not in the dense
  eager reference: its peak memory stays under a fifth of the dense scores it would materialise.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch

from evalm import EvalmModel, ModelConfig, flex, whole_sequence
from tests import models
from tests.evalm.paths import forced, recorded
from tests.evalm.test_eva_sink import heads, move, oracle
from train.parallelize import apply_compile

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


def grads_of(attn, q, k, v, weight, out, table: bool = True) -> list[torch.Tensor]:
    """Gradients of q, k, v, A_q, A_k and (with `table`) the T5 table."""
    params = [*attn.adaptive_mu_q.parameters(), *attn.adaptive_mu_k.parameters(),
              *(attn.rel_pos_bias.parameters() if attn.rel_pos_bias is not None and table else ())]
    return list(torch.autograd.grad((out * weight).sum(), [q, k, v, *params]))


STANCES = {"compiled": contextlib.nullcontext, "eager": lambda: torch.compiler.set_stance("force_eager")}
RECOMPUTE = {"flex": False, "kernel": False}  # a whole sequence as if neither kernel took it: plain PyTorch


@pytest.mark.parametrize("stance", STANCES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_fp32_forward_and_backward_equal_the_equation(variant, stance):
    changes, moved = VARIANTS[variant]
    cpu, dev = layers(changes, moved)
    S = changes.get("sink_tokens", 0)
    x = torch.randn(2, 300, LAYER.d_model, dtype=torch.float64)  # 3 row tiles, the last cut short
    weight = torch.randn(2, 300, LAYER.n_head, LAYER.d_model // LAYER.n_head, dtype=torch.float64)
    with torch.no_grad():
        q, k, v = heads(cpu, x)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    want_out = oracle(cpu, q, k, v, S, move=move if moved else None)
    # flex's eager reference does not differentiate a score_mod's captured tensors (torch 2.11): the
    # T5 table's gradient is the compiled kernel's alone (test_the_t5_bias_gradient_equals_the_equations)
    table = stance == "compiled"
    want = grads_of(cpu, q, k, v, weight, want_out, table)
    qd, kd, vd = (t.detach().to(DEVICE).float().requires_grad_() for t in (q, k, v))
    with STANCES[stance](), recorded() as taken:
        out = dev.attend(qd, kd, vd)
        got = grads_of(dev, qd, kd, vd, weight.to(DEVICE).float(), out, table)
    assert {p.name for p in taken} == {"flex"}
    errors = [rel(out, want_out.detach()), *(rel(g, w) for g, w in zip(got, want))]
    assert max(errors) < FP32, errors


def test_a_compiled_block_at_an_unaligned_length_equals_the_float64_block():
    """`train.compile` compiles each block whole, the route inside it: at 300 tokens (75 chunks, where
    inductor's code for the slots' backward was wrong) a compiled block's output and every parameter's
    gradient on the GPU in fp32 equal the same block in float64 on the CPU, within FP32."""
    config = dataclasses.replace(LAYER, overlap_window=True, use_t5_bias=True, sink_tokens=8)
    cpu = models.visible_model(config, seed=2).double().eval().blocks[0]
    model = models.visible_model(config, seed=2).to(DEVICE).float().eval()
    apply_compile(model)  # train.compile's own
    dev = model.blocks[0]
    x = torch.randn(2, 300, LAYER.d_model, dtype=torch.float64)
    weight = torch.randn_like(x)
    want_out = cpu(x)
    want = torch.autograd.grad((want_out * weight).sum(), list(cpu.parameters()))
    got_out = dev(x.to(DEVICE).float())
    got = torch.autograd.grad((got_out * weight.to(DEVICE).float()).sum(), list(dev.parameters()))
    errors = [rel(got_out.detach(), want_out.detach()), *(rel(g, w) for g, w in zip(got, want))]
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


def rel_on_device(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def test_a_benchmarked_shape_in_bf16_equals_the_recompute_route():
    """8,192 tokens, batch 2, 16 heads of 64, w 128, c 8 (the attention rows' 8k shape): the route on bf16
    q, k, v against `recompute` on the same values in fp32, forward and the gradients of q, k, v. Bound
    BF16: bf16 inputs, k̃, β and outputs (8 bits of mantissa), fp32 softmax inside; the recompute
    route's own fp32 error is four orders below it."""
    config = dataclasses.replace(LAYER, d_model=1024, n_head=16, window_size=128, chunk_size=8)
    torch.manual_seed(5)
    model = EvalmModel(config).to(DEVICE).eval()
    model.init_weights()
    attn = model.blocks[0].attn
    shape = (2, 8192, 16, 64)
    q, k, v = (torch.randn(shape, device=DEVICE).bfloat16().requires_grad_() for _ in range(3))
    weight = torch.randn(shape, device=DEVICE)
    with recorded() as taken:
        out = attn.attend(q, k, v)
        got = torch.autograd.grad((out * weight.bfloat16()).sum(), [q, k, v])
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    with forced(**RECOMPUTE), recorded() as plain:
        want_out = attn.attend(qf, kf, vf)
        want = torch.autograd.grad((want_out * weight).sum(), [qf, kf, vf])
    assert {p.name for p in taken} == {"flex"} and {p.name for p in plain} == {"recompute"}
    errors = [rel_on_device(out, want_out.detach()), *(rel_on_device(g, w) for g, w in zip(got, want))]
    assert out.dtype == torch.bfloat16 and max(errors) < BF16, errors


def test_rows_whose_every_key_is_dropped_are_zero_with_finite_gradients():
    """Attention dropout 0.9 on one call's `Tiling`: row 0 sees one key, row 1 two, so most (sequence,
    head) pairs have rows with every key dropped (the kept log-sum-exp is −inf there). The GPU route
    against the fused CPU route with the same keep decisions: equal outputs (those rows 0) and equal
    gradients of q, k, v, all finite."""
    cpu, dev = layers({"overlap_window": True, "use_t5_bias": True, "exclude_window_chunks": True}, False)
    cpu.float()
    t = dataclasses.replace(cpu.layout, dropout=0.9, seed=987654321)
    with torch.no_grad():
        q, k, v = heads(cpu, torch.randn(2, 300, LAYER.d_model, dtype=torch.float32))
    weight = torch.randn(q.shape)
    qd, kd, vd = (x.to(DEVICE).requires_grad_() for x in (q, k, v))
    got = flex.attend_layer(flex.LayerParts(t, dev.maps, dev.rel_pos_bias, None), qd, kd, vd)
    got_grads = torch.autograd.grad((got * weight.to(DEVICE)).sum(), [qd, kd, vd])
    w = cpu.window_size
    distance = torch.arange(w)[:, None] + cpu.ext - torch.arange(cpu.ext + w)
    bias = t.scale * cpu.rel_pos_bias(distance.clamp(min=0)).detach()
    qc, kc, vc = (x.clone().requires_grad_() for x in (q, k, v))
    want = whole_sequence.eva_attention(whole_sequence.WholeSequence(t, whole_sequence.FUSED, cpu.maps), qc, kc, vc, bias)
    want_grads = torch.autograd.grad((want * weight).sum(), [qc, kc, vc])
    dropped = want.detach().abs().sum(-1) == 0  # (B, n, H): rows that kept nothing
    assert dropped.any() and not dropped.all()
    assert torch.isfinite(got).all() and all(torch.isfinite(g).all() for g in got_grads)
    assert got.detach().cpu()[dropped].abs().max() == 0
    assert rel(got.detach(), want.detach().double()) < FP32
    assert max(rel(g, w.double()) for g, w in zip(got_grads, want_grads)) < FP32


@pytest.mark.parametrize("overlap", [False, True])
def test_the_t5_bias_gradient_equals_the_equations(overlap):
    """The T5 table reaches the kernel as a tensor its score_mod indexes; its gradient flows back through
    the kernel's backward. 520 tokens (5 row tiles), fp32: the table's gradient against the float64
    equation's, within FP32, and not zero (a table the backward ignored would give zeros)."""
    cpu, dev = layers({"overlap_window": overlap, "use_t5_bias": True}, False)
    x = torch.randn(2, 520, LAYER.d_model, dtype=torch.float64)
    weight = torch.randn(2, 520, LAYER.n_head, LAYER.d_model // LAYER.n_head, dtype=torch.float64)
    with torch.no_grad():
        q, k, v = heads(cpu, x)
    table_cpu = cpu.rel_pos_bias.relative_attention_bias.weight
    table_dev = dev.rel_pos_bias.relative_attention_bias.weight
    (want,) = torch.autograd.grad((oracle(cpu, q, k, v, 0) * weight).sum(), [table_cpu])
    with recorded() as taken:
        out = dev.attend(*(t.to(DEVICE).float() for t in (q, k, v)))
    (got,) = torch.autograd.grad((out * weight.to(DEVICE).float()).sum(), [table_dev])
    assert {p.name for p in taken} == {"flex"}
    assert want.norm() > 0 and rel(got, want) < FP32, rel(got, want)


@pytest.mark.timeout(180)  # nine kernels compiled, where one test is given 120 s
def test_nine_lengths_in_one_process_each_run_the_kernel():
    """Nine sequence lengths, one compiled kernel each: past dynamo's default limit of eight
    compilations of one function a silent fallback would run flex's dense eager reference, right but
    materialising every score. Each length's output equals the `recompute` route (FP32); at the
    longest, 4,100 tokens, the call's peak memory above its inputs stays under a fifth of the fp32
    scores (B·H·n·L: 1 × 4 × 4,100 × 5,376 slots, 353 MB) the reference would hold."""
    dev = models.visible_model(dataclasses.replace(LAYER, overlap_window=True), seed=6).to(DEVICE).float().eval()
    attn = dev.blocks[0].attn
    lengths = (150, 260, 390, 520, 650, 780, 910, 1040, 4100)
    for n in lengths:
        q, k, v = (torch.randn(1, n, LAYER.n_head, 16, device=DEVICE) for _ in range(3))
        with torch.no_grad(), forced(**RECOMPUTE):
            want = attn.attend(q, k, v)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.no_grad(), recorded() as taken:
            got = attn.attend(q, k, v)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        assert {p.name for p in taken} == {"flex"}, n
        assert rel_on_device(got, want) < FP32, n
    dense = 1 * LAYER.n_head * 4100 * flex.SlotLayout(4100, 4100 // 4, 0, 0).length * 4  # 5,376 slots (first chunk 0)
    assert peak < dense / 5, (peak, dense)
