"""`evalm eval needle-ranks` (icl_eval/recall/needle_ranks.py): the needle chunk's rank among a last query's
selection candidates by the summaries, Quest's bound and the exact logits.

    python -m pytest tests/icl_eval/test_needle_ranks.py -q

The instrument reads the cache as the prompt is encoded in segments; the oracle here recomputes every rank
from one whole-sequence forward (each layer's input captured, q and k projected, the summary keys as A_k of
the chunks' mean keys, EVA's own definition) with the candidates and the tie rule written out.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from evalm.config_toolkit import ConfigError
from evalm.eva import ablate
from evalm.icl_eval.models.lm import EvalmLM
from evalm.icl_eval.recall import needle_ranks
from evalm.icl_eval.recall.config import RecallConfig
from evalm.launcher.cli import main as evalm
from evalm.text.tokenizer import ByteTokenizer
from tests import models
from tests.evalm.test_eva_sink import BASE, heads

W, C = 16, 4


def tiny_lm(window: int = W) -> EvalmLM:
    tokenizer = ByteTokenizer()
    config = dataclasses.replace(BASE, vocab_size=tokenizer.vocab_size, window_size=window, chunk_size=C, circular_period=1024)
    return EvalmLM(models.visible_model(config).double(), tokenizer)


def oracle_ranks(lm: EvalmLM, prompt, needle: range) -> dict[str, list[int]]:
    """Every layer's ranks at the last token, from one forward of the whole prompt."""
    inputs = {}
    hooks = [b.attn.register_forward_pre_hook(lambda m, a, i=i: inputs.__setitem__(i, a[0])) for i, b in enumerate(lm.model.blocks)]
    with torch.no_grad():
        lm.model(torch.tensor([list(prompt)]))
    for h in hooks:
        h.remove()
    T = len(prompt)
    p = T - 1
    candidates = (p // W * W) // C  # chunks wholly before the last query's block
    out = {name: [] for name in needle_ranks.SCORES}
    for i, block in enumerate(lm.model.blocks):
        attn = block.attn
        with torch.no_grad():
            q, k, _ = heads(attn, inputs[i])
            kc = k[0, : candidates * C].reshape(candidates, C, attn.n_head, attn.head_dim)
            k_tilde = attn.adaptive_mu_k(kc.mean(1))  # (candidates, H, D)
        s = attn.head_dim**-0.5
        for h in range(attn.n_head):
            qh = q[0, p, h]
            scores = {"summary": [s * float(qh @ k_tilde[r, h]) for r in range(candidates)],
                      "bound": [s * float(torch.maximum(qh * kc[r, :, h].amin(0), qh * kc[r, :, h].amax(0)).sum())
                                for r in range(candidates)],
                      "exact": [s * float((kc[r, :, h] @ qh).max()) for r in range(candidates)]}
            for name, score in scores.items():
                place = [sum(score[o] > score[r] or score[o] == score[r] and o < r for o in range(candidates))
                         for r in range(candidates)]
                out[name].append(min(place[r] for r in needle))
    return out


@pytest.mark.parametrize("ablation", ["none", "no-remote"])
def test_ranks_read_through_the_cache_equal_the_whole_sequence_oracle(ablation):
    """With the summaries off (`--eva-ablation no-remote`) the model reads its window alone and the ranks are
    still of the chunks before it."""
    lm = tiny_lm()
    ablate(lm.model, ablation)
    config = RecallConfig(tasks=("passkey",), lengths=(600,), depths=(0, 50, 100), seeds=(1,), items=1)
    records = needle_ranks.needle_ranks(lm, config, segment=97, progress=lambda line: None)
    assert [r["depth"] for r in records] == [0, 50, 100]
    prompts = needle_ranks._item_prompts(("passkey", 600, 1, 0), config, lm, needle_ranks.Haystacks(lm.tokenizer))
    for record, (prompt, at, size) in zip(records, prompts):
        assert record["tokens"] == len(prompt) and record["needle_at"] == at
        assert not record["in_window"]
        want = oracle_ranks(lm, prompt, range(at // C, (at + size - 1) // C + 1))
        assert record["ranks"] == want
        assert len(want["summary"]) == 2 * BASE.n_head and want["bound"] != want["summary"]
    assert "| passkey | 600 | 50 | bound |" in needle_ranks.table(records)


def test_a_needle_inside_the_window_has_no_rank():
    """With a window of 512 the last query of 700 tokens reads tokens 512 on exactly: a needle at depth 100 lies there."""
    lm = tiny_lm(window=512)
    config = RecallConfig(tasks=("passkey",), lengths=(700,), depths=(0, 100), seeds=(1,), items=1)
    first, last = needle_ranks.needle_ranks(lm, config, progress=lambda line: None)
    assert not first["in_window"] and len(first["ranks"]["exact"]) == 2 * BASE.n_head
    assert last["in_window"] and last["ranks"] == {name: [] for name in needle_ranks.SCORES}
    assert "| passkey | 700 | 100 | summary | - |" in needle_ranks.table([first, last])


def test_bad_flags_and_a_model_without_eva_are_refused_in_one_line(tmp_path, capsys):
    for flags, said in [(["--lengths", "8k"], "--lengths 8k: give whole numbers"),
                        (["--tasks", "bogus"], "unknown family bogus"), (["--depths", "150"], "from 0 to 100"),
                        (["--hf-model", str(tmp_path / "none")], "no such folder")]:
        assert evalm(["eval", "needle-ranks", "--hf-model", str(tmp_path), *flags]) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err and err.count("\n") == 1
    full = EvalmLM(models.visible_model(dataclasses.replace(BASE, attention="full", vocab_size=ByteTokenizer().vocab_size)),
                   ByteTokenizer())
    with pytest.raises(ConfigError, match="no EVA attention layer"):
        needle_ranks.needle_ranks(full, RecallConfig(tasks=("passkey",), lengths=(600,)), progress=lambda line: None)


def _llama_layer_inputs(model, tokens: torch.Tensor) -> list[torch.Tensor]:
    """The hidden states entering every layer's attention over one whole-sequence forward."""
    seen = []
    hooks = [layer.self_attn.register_forward_hook(lambda m, args, kwargs, out: seen.append(kwargs["hidden_states"]),
                                                   with_kwargs=True) for layer in model.model.layers]
    with torch.no_grad():
        model(tokens, use_cache=False)
    for h in hooks:
        h.remove()
    return seen


MOVED_TIE = 1e-6
"""Scores closer than this may rank either way: Llama's rotary computes its angles in float32, and the instrument
turns keys twice (at their positions, then by the move) where the oracle turns them once (tests/evalm/
test_hf_selection.py, MOVED). Chunks of the same tokens tie exactly in the first layer once moved to one place
(the passkey's filler repeats), so some readings admit several ranks."""


def moved_oracle(model, prompt, needle: range, w: int, c: int, first: int) -> dict[str, list[tuple[int, int]]]:
    """The ranks by the moved bound, the moved exact logit and the window bound, each as the (lowest, highest) rank
    that scores within MOVED_TIE of each other allow: each candidate chunk's raw keys rotated by Llama's own RoPE at
    ws − c … ws − 1 (ws the last query's window start, overlap included), not moved from their positions; for the
    window bound at −c … −1, read by the raw query rotated at its offset from ws."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    tokens = torch.tensor([list(prompt)])
    p = len(prompt) - 1
    ws = max(0, p // w * w - w)
    candidates = range(first, ws // c)
    rotary = model.model.rotary_emb
    out = {name: [] for name in needle_ranks.MOVED_SCORES}
    for attn, x in zip((layer.self_attn for layer in model.model.layers), _llama_layer_inputs(model, tokens)):
        D, H = attn.head_dim, model.config.num_attention_heads
        with torch.no_grad():
            raw_q = q = attn.q_proj(x).view(1, -1, H, D).transpose(1, 2)
            k = attn.k_proj(x).view(1, -1, H // 2, D).transpose(1, 2).repeat_interleave(2, 1)  # (1, H, T, D)
            q, _ = apply_rotary_pos_emb(q, q, *rotary(x, torch.arange(len(prompt))[None]))
            at, anchor = rotary(x, torch.arange(ws - c, ws)[None]), rotary(x, torch.arange(-c, 0)[None])
            moved, anchored = ({r: apply_rotary_pos_emb(k[..., r * c : r * c + c, :], k[..., r * c : r * c + c, :],
                                                        *place)[0][0] for r in candidates} for place in (at, anchor))
            reader = apply_rotary_pos_emb(raw_q, raw_q, *rotary(x, (torch.arange(len(prompt)) - ws)[None]))[0]
        s = D**-0.5
        for group in range(H // 2):
            heads = (2 * group, 2 * group + 1)
            scores = {"bound, moved": {r: sum(s * float(torch.maximum(q[0, h, p] * moved[r][h].amin(0),
                                                                      q[0, h, p] * moved[r][h].amax(0)).sum())
                                              for h in heads) for r in candidates},
                      "exact, moved": {r: sum(s * float((moved[r][h] @ q[0, h, p]).max()) for h in heads)
                                       for r in candidates},
                      "window-bound": {r: sum(s * float(torch.maximum(reader[0, h, p] * anchored[r][h].amin(0),
                                                                      reader[0, h, p] * anchored[r][h].amax(0)).sum())
                                              for h in heads) for r in candidates}}
            for name, score in scores.items():
                low = {r: sum(score[o] > score[r] + MOVED_TIE for o in candidates) for r in candidates}
                high = {r: sum(score[o] > score[r] - MOVED_TIE for o in candidates if o != r) for r in candidates}
                out[name].append((min(low[r] for r in needle if r in low), min(high[r] for r in needle if r in high)))
    return out


def test_a_host_that_moves_keys_also_ranks_every_chunk_at_one_distance():
    """The sink conversion's rule on a tiny Llama (RoPE, 4 query heads over 2 key/value heads, overlapping blocks, a
    sink moved before the window): the moved ranks equal an oracle that rotates the raw keys to their place, and
    differ from the ranks at the keys' own positions."""
    from evalm.hf_llama import EvaLlamaForCausalLM
    from evalm.icl_eval.models.hf_eva import EvaHFCausalLM
    from tests.models import hf_llama

    tokenizer = ByteTokenizer()
    llama = hf_llama(0, vocab_size=tokenizer.vocab_size, max_position_embeddings=1024)
    model = EvaLlamaForCausalLM.from_llama(llama, window_size=W, chunk_size=C, overlap_window=True, sink_tokens=C,
                                           sink_positions="window", exclude_window_chunks=True)
    lm = EvaHFCausalLM(model, tokenizer)
    config = RecallConfig(tasks=("passkey",), lengths=(600,), depths=(0, 50), seeds=(1,), items=1)
    records = needle_ranks.needle_ranks(lm, config, segment=97, progress=lambda line: None)
    prompts = needle_ranks._item_prompts(("passkey", 600, 1, 0), config, lm, needle_ranks.Haystacks(tokenizer))
    for record, (prompt, at, size) in zip(records, prompts):
        want = moved_oracle(model, prompt, range(at // C, (at + size - 1) // C + 1), W, C, first=1)
        for name in needle_ranks.MOVED_SCORES:
            assert all(low <= got <= high for got, (low, high) in zip(record["ranks"][name], want[name], strict=True))
            assert 2 * sum(low == high for low, high in want[name]) >= len(want[name])  # most readings pin one rank
        assert record["ranks"]["exact, moved"] != record["ranks"]["exact"]
    assert "| passkey | 600 | 50 | exact, moved |" in needle_ranks.table(records)
    assert "moved" not in needle_ranks.table(needle_ranks.needle_ranks(tiny_lm(), config, progress=lambda line: None))
