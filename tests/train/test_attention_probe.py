"""`evalm train probe`: the exact attention's mass outside EVA's window and EVA's error with and without its
summaries, per layer, against oracles written here (a per-query softmax loop; a dense masked softmax of the
source Llama's own heads, captured through transformers' attention interface)."""

from __future__ import annotations

import json
import math

import pytest
import torch

pytest.importorskip("transformers")

from evalm.tiling import Ablation  # noqa: E402
from evalm.train.attention_probe import buckets, main, outside_mass, probe, read_lines  # noqa: E402
from tests.train.llama_helpers import converted_tiny  # noqa: E402


def test_the_mass_outside_the_window_is_the_softmax_summed_by_hand():
    torch.manual_seed(0)
    B, H, T, D, S = 1, 2, 40, 8, 4
    q, k = torch.randn(B, H, T, D, dtype=torch.float64), torch.randn(B, H, T, D, dtype=torch.float64)
    starts = torch.tensor([max(0, i // 8 * 8) for i in range(T)])
    outside, sink = outside_mass(q, k, starts, S, D**-0.5)
    for i in (3, 8, 17, 39):
        p = torch.softmax(D**-0.5 * torch.einsum("hd,hjd->hj", q[0, :, i], k[0, :, : i + 1]), -1)  # (H, i + 1)
        ws = int(starts[i])
        assert torch.allclose(outside[0, :, i].double(), p[:, S:ws].sum(-1) if ws > S else torch.zeros(H, dtype=torch.float64), atol=1e-6)
        assert torch.allclose(sink[0, :, i].double(), p[:, : min(S, ws)].sum(-1), atol=1e-6)


def test_buckets_double_from_the_window_and_stop_at_the_line():
    assert buckets(32, 8) == [(8, 16), (16, 32)]
    assert buckets(40, 8) == [(8, 16), (16, 32), (32, 40)]
    assert buckets(8, 8) == []


def _source_heads(source_folder, line):
    """The source Llama's layer-0 rotated heads on `line`, captured by an attention function of our own."""
    import transformers

    seen = {}

    def record(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if module.layer_idx == 0:
            seen.update(q=query, k=key, v=value)
        groups = query.shape[1] // key.shape[1]
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1), is_causal=True, scale=scaling)
        return out.transpose(1, 2), None

    transformers.AttentionInterface.register("probe_test_record", record)
    llama = transformers.LlamaForCausalLM.from_pretrained(source_folder, attn_implementation="probe_test_record")
    with torch.no_grad():
        logits = llama(line[None], use_cache=False).logits
    return seen, logits


def test_the_probe_reads_the_original_attention_and_the_window_alone_by_hand(tmp_path):
    """Teacher forcing: the probed model's logits are the source Llama's. Layer 0's error without summaries is
    the window-only softmax against the full one, computed densely from the source's heads; with summaries it
    differs (the ablation is applied, then undone)."""
    from evalm.train.uptrain_model import load_converted

    source, converted, shards = converted_tiny(tmp_path)
    line = read_lines(shards, 32, 1, 0)[0]
    model = load_converted(converted)
    layers = probe(model, [line], window=8)
    heads, source_logits = _source_heads(source, line)
    with torch.no_grad():
        probed_logits = model(line[None], use_cache=False).logits
    assert torch.allclose(probed_logits, source_logits, atol=1e-4)  # every layer saw the original hidden states

    q, v = heads["q"].double(), heads["v"].double()
    groups = q.shape[1] // heads["k"].shape[1]
    k, v = heads["k"].double().repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    T, D = q.shape[2], q.shape[3]
    logits = q @ k.transpose(-1, -2) * D**-0.5
    i, j = torch.arange(T)[:, None], torch.arange(T)[None]
    full = logits.masked_fill(j > i, -math.inf).softmax(-1) @ v
    window = logits.masked_fill((j > i) | (j < i // 8 * 8), -math.inf).softmax(-1) @ v
    per_query = ((window - full) ** 2).mean((1, 3))[0]  # over heads and D
    want = [float(per_query[a:b].mean()) for a, b in buckets(T, 8)]
    assert layers[0]["error_no_remote"] == pytest.approx(want, rel=1e-3, abs=1e-9)
    assert all(e > 0 for e in want)
    assert layers[0]["error"] != pytest.approx(layers[0]["error_no_remote"], rel=1e-3)  # the summaries are read
    assert all(m.eva.layout.ablation is Ablation.NONE for m in (layer.self_attn for layer in model.model.layers))
    assert all(0.0 < o < 1.0 for layer in layers for o in layer["outside"])


def test_the_command_writes_its_figures_and_refuses_in_one_line(tmp_path, capsys):
    _, converted, shards = converted_tiny(tmp_path)
    out = tmp_path / "probe"
    assert main(["--hf-model", str(converted), "--shards", str(shards), "--seq-len", "32", "--lines", "2",
                 "--out", str(out), "--device", "cpu"]) == 0
    result = json.loads((out / "probe.json").read_text())
    assert result["buckets"] == [[8, 16], [16, 32]] and len(result["layers"]) == 2
    assert "| 0 | outside |" in capsys.readouterr().out
    assert main(["--hf-model", str(converted), "--shards", str(shards), "--seq-len", "32", "--lines", "100000",
                 "--out", str(tmp_path / "many")]) == 2
    assert "fewer than --lines 100000" in capsys.readouterr().err
