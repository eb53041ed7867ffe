"""EVA inside `transformers` (evalm/hf_*.py), against independent oracles, in float64.

    python -m pytest tests/evalm/test_hf_eva.py -q

- EVALM under `transformers` (`EvalmForCausalLM`, the attention called through the registered
  "eva" function, the `EvaCache`) equals `EvalmModel` with the same weights: logits and every
  parameter's gradient to 1e-10, one-shot and in segments, for the T5 bias, overlapping windows,
  the EvaByte exclusion and both position schemes.
- A Llama with EVA (grouped-query heads, RoPE) equals the per-token NumPy oracle of the closed form
  (tests/evalm/oracle.py) applied to its own rotated heads, with and without the cache; with the
  exclusion and w ≥ n it equals `transformers`' own softmax Llama, and without them it does not.
- `generate()` keeps an `EvaCache`: greedy equals recomputing the whole sequence every step, token
  for token; sampling equals sampling without a cache under one seed; the cache holds exactly the
  bytes of the EVA formula (n // c summaries, the window rows, the pending queries).
- Refusals are one line naming the field; registration is explicit.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from evalm import ModelConfig  # noqa: E402
from evalm.config_toolkit import ConfigError  # noqa: E402
from evalm.hf_cache import CACHE_ARG, EvaCache  # noqa: E402
from evalm.hf_evalm import EvalmConfig, EvalmForCausalLM  # noqa: E402
from evalm.hf_llama import EvaLlamaConfig, EvaLlamaForCausalLM  # noqa: E402
from tests.evalm.oracle import eva_heads_per_token  # noqa: E402
from tests.models import hf_llama, visible_model  # noqa: E402

EXACT = 1e-10
SHAPE = dict(vocab_size=61, d_model=16, n_layer=2, n_head=2, d_ff=32, window_size=8, chunk_size=2,
             circular_period=24, dropout=0.0, attn_dropout=0.0)
VARIANTS = {
    "plain": {},
    "t5-overlap": {"use_t5_bias": True, "overlap_window": True},
    "exclusion-noln-absolute": {"exclude_window_chunks": True, "adaptive_proj": "no-ln", "positions": "absolute"},
}


def evalm_pair(**overrides):
    """(EvalmModel, EvalmForCausalLM) with the same float64 weights."""
    config = ModelConfig(**{**SHAPE, **overrides})
    ref = visible_model(config).double().eval()
    hf = EvalmForCausalLM(EvalmConfig.of(config)).double().eval()
    hf.load_state_dict(ref.state_dict(), strict=True)
    return ref, hf


def eva_llama(seed: int = 0, **settings):
    """A tiny Llama with EVA, A_q/A_k drawn wide so the summaries matter."""
    model = EvaLlamaForCausalLM.from_llama(hf_llama(seed), **settings)
    torch.manual_seed(seed + 1)
    with torch.no_grad():
        for layer in model.model.layers:
            for p in layer.self_attn.eva.parameters():
                p.normal_(0, 0.3)
    return model


def ids(B: int = 2, T: int = 45, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, SHAPE["vocab_size"], (B, T), generator=torch.Generator().manual_seed(seed))


def _grads(model, logits, weights) -> dict[str, torch.Tensor]:
    model.zero_grad()
    (logits * weights).sum().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("variant", VARIANTS)
def test_transformers_path_equals_evalm_model_logits_and_gradients(variant):
    ref, hf = evalm_pair(**VARIANTS[variant])
    tokens = ids()  # 45 tokens: 5 blocks of 8, 22 chunks, positions past the period 24
    weights = torch.randn(2, 45, SHAPE["vocab_size"], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    want = ref(tokens)
    got = hf(tokens, use_cache=False).logits
    assert (got - want).abs().max() <= EXACT
    g_ref, g_hf = _grads(ref, ref(tokens), weights), _grads(hf, hf(tokens, use_cache=False).logits, weights)
    assert g_ref.keys() == g_hf.keys()
    for name in g_ref:
        assert (g_ref[name] - g_hf[name]).abs().max() <= EXACT, name
    cache = EvaCache.for_config(hf.config)
    pieces = [hf(tokens[:, i : i + n], **{CACHE_ARG: cache}).logits for i, n in ((0, 1), (1, 7), (8, 13), (21, 24))]
    assert (torch.cat(pieces, 1) - want).abs().max() <= EXACT
    assert cache.get_seq_length() == 45


def test_in_training_the_transformers_path_draws_the_same_dropout_and_noise():
    """Residual and attention dropout and the summaries' noise ε come from torch's RNG in the same
    order: one seed, the same training forward (what fine-tuning through transformers relies on)."""
    ref, hf = evalm_pair(dropout=0.1, attn_dropout=0.1, use_t5_bias=True)
    tokens = ids()
    outs = []
    for model in (ref.train(), hf.train()):
        torch.manual_seed(7)
        outs.append(model(tokens) if model is ref else model(tokens, use_cache=False).logits)
    assert (outs[0] - outs[1]).abs().max() <= EXACT
    torch.manual_seed(8)
    assert (hf(tokens, use_cache=False).logits - outs[1]).abs().max() > 1e-3  # the draws matter


def _attention_inputs(model, layer: int, tokens):
    """The hidden states entering layer `layer`'s attention and the module's output, captured by a hook."""
    seen = {}

    def hook(module, args, kwargs, output):
        seen["x"] = kwargs.get("hidden_states", args[0] if args else None)
        seen["rope"] = kwargs["position_embeddings"]
        seen["out"] = output[0]

    handle = model.model.layers[layer].self_attn.register_forward_hook(hook, with_kwargs=True)
    out = model(tokens, use_cache=False)
    handle.remove()
    return seen, out


def _oracle_heads(attn, x, rope):
    """q, k, v of the Llama module `attn` rotated as Llama rotates them, k/v repeated over each group."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    B, T, _ = x.shape
    D = attn.head_dim
    q, k, v = (proj(x).view(B, T, -1, D).transpose(1, 2) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    q, k = apply_rotary_pos_emb(q, k, *rope)
    groups = q.shape[1] // k.shape[1]
    arrays = [t.transpose(1, 2).detach().numpy() for t in (q, k, v)]
    return arrays[0], np.repeat(arrays[1], groups, axis=2), np.repeat(arrays[2], groups, axis=2)


@pytest.mark.parametrize("settings", [dict(window_size=8, chunk_size=2, use_t5_bias=True, overlap_window=True),
                                      dict(window_size=4, chunk_size=4, positions="circular", circular_period=16)],
                         ids=["t5-overlap", "circular-rope"])
def test_llama_attention_is_eva_of_its_rotated_grouped_heads(settings):
    model = eva_llama(**settings)
    tokens = ids(T=30)
    seen, out = _attention_inputs(model, 1, tokens)
    attn = model.model.layers[1].self_attn
    if settings.get("positions") == "circular":  # RoPE at i mod 16: the rotation of token i + 16 is token i's
        cos, sin = seen["rope"]
        assert torch.equal(cos[:, 16:], cos[:, :-16]) and torch.equal(sin[:, 16:], sin[:, :-16])
        assert not torch.equal(cos[:, 8:], cos[:, :-8])
    q, k, v = _oracle_heads(attn, seen["x"], seen["rope"])
    heads = torch.from_numpy(eva_heads_per_token(attn.eva, q, k, v))
    want = attn.o_proj(heads.reshape(*heads.shape[:2], -1))
    assert (seen["out"] - want).abs().max() <= EXACT
    cache = EvaCache.for_config(model.config)
    pieces = [model(tokens[:, i : i + 5], **{CACHE_ARG: cache}).logits for i in range(0, 30, 5)]
    assert (torch.cat(pieces, 1) - out.logits).abs().max() <= EXACT


def test_with_the_exclusion_and_a_window_over_everything_eva_is_transformers_softmax_llama():
    llama = hf_llama(attn_implementation="sdpa")  # eager Llama softmaxes in float32; sdpa keeps float64
    tokens = ids(T=30)
    want = llama(tokens, use_cache=False).logits
    exact = EvaLlamaForCausalLM.from_llama(llama, window_size=32, chunk_size=4, exclude_window_chunks=True)
    assert (exact(tokens, use_cache=False).logits - want).abs().max() <= EXACT
    assert (exact(tokens).logits - want).abs().max() <= EXACT  # through the cache
    for settings in (dict(window_size=32, chunk_size=4), dict(window_size=8, chunk_size=4, exclude_window_chunks=True)):
        other = EvaLlamaForCausalLM.from_llama(llama, **settings)  # summaries seen, or a window cut: not softmax
        assert (other(tokens, use_cache=False).logits - want).abs().max() > 1e-3


def test_sink_keys_moved_before_the_window_are_the_keys_at_those_positions():
    """`sink_positions = "window"`: layer 1's attention (summaries off) is the softmax over the local keys
    at their positions and sink key j rotated at window_start(i) − S + j (StreamingLLM's positions),
    computed here from the unrotated projections with transformers' own RoPE at those positions. The
    move composes rotations in float32 angles, so the match is to 1e-6, not float64 rounding."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, rotate_half

    from evalm.eva import ablate

    S, w = 4, 8
    model = eva_llama(window_size=w, chunk_size=4, sink_tokens=S, overlap_window=True, sink_positions="window")
    assert ablate(model, "no-remote") == 2
    tokens = ids(T=40)
    seen, _ = _attention_inputs(model, 1, tokens)
    attn, x = model.model.layers[1].self_attn, seen["x"]
    B, T, D = *x.shape[:2], attn.head_dim
    q, k, v = (proj(x).view(B, T, -1, D).transpose(1, 2) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], 1) for t in (k, v))
    q_rot, k_rot = apply_rotary_pos_emb(q, k, *model.model.rotary_emb(x, torch.arange(T)[None]))
    i, j = torch.arange(T)[:, None], torch.arange(T)[None]
    start = (i // w * w - w).clamp(min=0)  # overlap: from the previous block's start
    at = start - S + torch.arange(S)[None]  # (T, S): where each query reads sink key j
    cos, sin = (t.view(T, S, D) for t in model.model.rotary_emb(x, at.reshape(1, -1)))
    sink_k = k[:, :, None, :S] * cos + rotate_half(k[:, :, None, :S]) * sin  # (B, H, T, S, D)
    s = D**-0.5
    local = (s * q_rot @ k_rot.transpose(-1, -2)).masked_fill(~((j <= i) & (j >= start)), float("-inf"))
    sunk = (s * torch.einsum("bhid,bhijd->bhij", q_rot, sink_k)).masked_fill(~(torch.arange(S)[None] < start.clamp(max=S)),
                                                                              float("-inf"))
    p = torch.softmax(torch.cat([local, sunk], -1), -1)
    heads = p[..., :T] @ v + p[..., T:] @ v[:, :, :S]
    want = attn.o_proj(heads.transpose(1, 2).reshape(B, T, -1))
    assert (seen["out"] - want).abs().max() < 1e-6
    own = eva_llama(window_size=w, chunk_size=4, sink_tokens=S, overlap_window=True)  # the same weights, keys unmoved
    ablate(own, "no-remote")
    assert (_attention_inputs(own, 1, tokens)[0]["out"] - want).abs().max() > 1e-3


def test_sink_positions_that_cannot_compose_are_refused_in_one_line():
    llama = hf_llama()
    for settings, said in [(dict(window_size=8, chunk_size=4, sink_positions="window"), "without sink_tokens"),
                           (dict(window_size=8, chunk_size=4, sink_tokens=4, sink_positions="window", positions="circular"),
                            "does not compose"),
                           (dict(window_size=8, chunk_size=4, sink_tokens=4, sink_positions="moved"), "sink_positions: Input should be 'own' or 'window'")]:
        with pytest.raises(ConfigError) as err:
            EvaLlamaForCausalLM.from_llama(llama, **settings)
        assert said in _one_line(err), settings
    scaled = hf_llama(rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    with pytest.raises(ConfigError) as err:
        EvaLlamaForCausalLM.from_llama(scaled, window_size=8, chunk_size=4, sink_tokens=4, sink_positions="window")
    assert "fixed rotation per position" in _one_line(err)


def _recompute_greedy(model, prompt, n_new: int) -> torch.Tensor:
    seq = prompt
    for _ in range(n_new):
        seq = torch.cat([seq, model(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)], 1)
    return seq


def eva_bytes(config, n: int, n_layer: int, H: int, D: int, B: int = 1) -> int:
    """The EVA formula: per layer, n // c summaries (k̃, β), the window rows from ⌊n/w⌋·w − ext, the
    queries of the incomplete chunk; float64. With S sink tokens: their min(S, n) keys and values, and
    no summaries of their S/c chunks."""
    w, c, S = config["window_size"], config["chunk_size"], config.get("sink_tokens", 0)
    ext = w if config.get("overlap_window") else 0
    rows = n - max(0, n // w * w - ext)
    return n_layer * B * H * D * 8 * (2 * max(0, n // c - S // c) + 2 * min(S, n) + 2 * rows + (n - n // c * c))


@pytest.mark.parametrize("kind", ["evalm", "llama", "llama-sink"])
def test_generate_keeps_an_eva_cache_greedy_equals_recompute_and_its_size_is_the_formula(kind):
    if kind == "evalm":
        settings = {**SHAPE, "use_t5_bias": True, "overlap_window": True}
        _, model = evalm_pair(use_t5_bias=True, overlap_window=True)
        H, D, L = SHAPE["n_head"], SHAPE["d_model"] // SHAPE["n_head"], SHAPE["n_layer"]
    else:
        settings = dict(window_size=8, chunk_size=2, use_t5_bias=True)
        if kind == "llama-sink":  # the prompt (11) ends inside the sink (12): generation fills it
            settings |= dict(sink_tokens=12, overlap_window=True, sink_positions="window")
        model = eva_llama(**settings)
        H, D, L = 4, 8, 2  # the 4 query heads: grouped keys and values are kept repeated
    prompt = ids(B=1, T=11)
    kw = dict(max_new_tokens=25, pad_token_id=0, attention_mask=torch.ones_like(prompt))  # token 0 is no padding
    cache = EvaCache.for_config(model.config)
    got = model.generate(prompt, do_sample=False, **kw, **{CACHE_ARG: cache})
    assert torch.equal(got, _recompute_greedy(model, prompt, 25))
    n = 11 + 25 - 1  # the last token is never fed
    assert cache.get_seq_length() == n and cache.nbytes() == eva_bytes(settings, n, L, H, D)
    assert torch.equal(model.generate(prompt, do_sample=False, **kw), got)  # a cache of its own
    sampled = []
    for use_cache in (True, False):
        torch.manual_seed(3)
        sampled.append(model.generate(prompt, do_sample=True, top_k=0, temperature=1.5, use_cache=use_cache, **kw))
    assert torch.equal(sampled[0], sampled[1]) and not torch.equal(sampled[0], got)


def test_the_cache_grows_linearly_token_by_token():
    _, model = evalm_pair(overlap_window=True)
    cache = EvaCache.for_config(model.config)
    settings = {**SHAPE, "overlap_window": True}
    for n, token in enumerate(ids(B=1, T=40)[0], 1):
        model(token.view(1, 1), **{CACHE_ARG: cache})
        assert cache.nbytes() == eva_bytes(settings, n, 2, 2, 8), n


def _one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text
    return text


def test_a_layout_eva_cannot_take_is_refused_in_one_line_naming_the_field():
    llama = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=1)
    with pytest.raises(ConfigError) as err:
        EvaLlamaConfig(num_attention_heads=4, num_key_value_heads=3, **llama)
    assert "num_key_value_heads=3" in _one_line(err)
    with pytest.raises(ConfigError) as err:
        EvaLlamaConfig(**{**llama, "hidden_size": 30}, num_attention_heads=4)
    assert "hidden_size=30" in _one_line(err)
    with pytest.raises(ConfigError) as err:
        EvaLlamaForCausalLM(EvaLlamaConfig(num_attention_heads=4, evalm={"window_size": 6, "chunk_size": 4}, **llama))
    assert "window_size=6" in _one_line(err)
    with pytest.raises(ConfigError) as err:
        EvaLlamaConfig(num_attention_heads=4, evalm={"window": 8}, **llama)
    assert "window" in _one_line(err) and "valid keys" in str(err.value)


def test_what_eva_cannot_continue_is_refused_in_one_line():
    _, model = evalm_pair()
    with pytest.raises(ConfigError) as err:  # left padding shifts blocks and chunks
        model(ids(T=6), attention_mask=torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1]]))
    assert "right-padded" in _one_line(err)
    filled = transformers.DynamicCache()
    filled.update(torch.zeros(1, 2, 3, 8, dtype=torch.float64), torch.zeros(1, 2, 3, 8, dtype=torch.float64), 0)
    with pytest.raises(ConfigError) as err:  # it kept keys, not the queries the summaries need
        model(ids(B=1, T=2), **{CACHE_ARG: filled})
    assert "EvaCache" in _one_line(err)
    plain = hf_llama()
    plain.config._attn_implementation = "eva"
    with pytest.raises(ConfigError) as err:
        plain(ids(T=4))
    assert "no EVA parameters" in _one_line(err)
    with pytest.raises(ConfigError) as err:
        model.generate(ids(B=1, T=4), max_new_tokens=2, num_beams=2, do_sample=False, pad_token_id=0,
                       attention_mask=torch.ones(1, 4, dtype=torch.long))
    assert "beams" in _one_line(err)


def test_right_padding_is_taken_and_changes_nothing_before_the_pad():
    _, model = evalm_pair()
    tokens = ids(T=20)
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[1, 13:] = 0
    padded = model(tokens, attention_mask=mask, use_cache=False).logits
    alone = model(tokens[1:, :13], use_cache=False).logits
    assert (padded[1, :13] - alone[0]).abs().max() <= EXACT


def test_registration_is_explicit_and_import_evalm_loads_neither_torch_nor_transformers():
    code = ("import sys, evalm\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n"
            "from transformers import AttentionInterface, AutoConfig\n"
            "assert 'eva' not in AttentionInterface._global_mapping\n"
            "evalm.register_with_transformers()\n"
            "assert 'eva' in AttentionInterface._global_mapping\n"
            "assert type(AutoConfig.for_model('evalm', evalm={'d_model': 8, 'n_head': 2})).__name__ == 'EvalmConfig'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
