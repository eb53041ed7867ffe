"""Selection inside EVA's memory under `transformers` (`select_chunks` in a config's `evalm` section, ranked
by the summaries or by Quest's bound, `select_by`), in float64.

    python -m pytest tests/evalm/test_hf_selection.py -q

- A Llama with EVA and selection (grouped-query heads: one choice per K/V group, RoPE) equals the selection
  oracle (tests/evalm/test_eva_selection.py) on its own rotated heads, with the selected tokens at their own
  positions and moved before the window (`selected_positions = "window"`, the keys rotated at those positions).
- `generate()` keeps an `EvaCache`: greedy equals recomputing the whole sequence every step.
- The setting survives `save_pretrained` / `from_pretrained` (what `evalm convert` and `export --hf` write).
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from evalm.config_toolkit import ConfigError  # noqa: E402
from evalm.hf_cache import CACHE_ARG, EvaCache  # noqa: E402
from evalm.hf_llama import EvaLlamaForCausalLM  # noqa: E402
from tests.evalm.test_eva_selection import oracle  # noqa: E402
from tests.evalm.test_hf_eva import _attention_inputs, _oracle_heads, _recompute_greedy, eva_llama, ids  # noqa: E402
from tests.models import hf_llama  # noqa: E402

EXACT = 1e-10
MOVED = 1e-5
"""Selected tokens moved before the window: Llama's rotary computes its angles in float32, and the move is made of
two rotations (the query turned back by its window's start, each key on by the rest: evalm/tiles.py,
`_moved_picks`), equal to the oracle's one rotation to float32's rounding of an angle (~1e-6 here); a wrong slot
or chunk is off by more than 1e-3."""
SETTINGS = dict(window_size=8, chunk_size=2, select_chunks=2)


def rotate(rotary, keys: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Keys (…, D) already rotated at their positions, rotated on by `shift` as RoPE would: written here from
    Llama's rotate_half, not taken from the adapter's move."""
    cos, sin = rotary(keys, shift.reshape(1, -1))
    cos, sin = (x.view(*shift.shape, -1) for x in (cos, sin))
    half = keys.shape[-1] // 2
    return keys * cos + torch.cat([-keys[..., half:], keys[..., :half]], -1) * sin


SINK = dict(overlap_window=True, sink_tokens=2, sink_positions="window", select_only=True)  # the converted SmolLM2's


@pytest.mark.parametrize("placement,by,more", [("own", "summary", {}), ("window", "summary", {}), ("own", "bound", {}),
                                               ("window", "bound", {}), ("window", "bound", SINK),
                                               ("window", "window-bound", {}), ("window", "window-bound", SINK)])
def test_llama_attention_with_selection_is_the_oracle_of_its_rotated_grouped_heads(placement, by, more):
    """The last case is the sink conversion's rule: overlapping blocks, a sink and the selected tokens both moved
    before the window (the sink k·c further back), window + selection only."""
    model = eva_llama(**SETTINGS, selected_positions=placement, select_by=by, **more)
    tokens = ids(T=40)
    seen, out = _attention_inputs(model, 1, tokens)
    attn = model.model.layers[1].self_attn
    assert attn.eva.layout.select_group == 2  # 4 query heads over 2 key/value heads
    q, k, v = (torch.from_numpy(x) for x in _oracle_heads(attn, seen["x"], seen["rope"]))
    move = (lambda keys, shift: rotate(model.model.rotary_emb, keys, shift)) if placement == "window" else None
    heads = oracle(attn.eva, q, k, v, group=2, move=move)
    want = attn.o_proj(heads.reshape(*heads.shape[:2], -1))
    assert (seen["out"] - want).abs().max() <= (EXACT if move is None else MOVED)
    assert (heads - oracle(attn.eva, q, k, v, group=1, move=move)).abs().max() > 1e-3  # the group's choice matters
    cache = EvaCache.for_config(model.config)
    pieces = [model(tokens[:, i : i + 5], **{CACHE_ARG: cache}).logits for i in range(0, 40, 5)]
    assert (torch.cat(pieces, 1) - out.logits).abs().max() <= EXACT


@pytest.mark.parametrize("by", ["summary", "bound"])
def test_generate_with_selection_equals_recompute(by):
    model = eva_llama(**SETTINGS, select_by=by)
    prompt = ids(B=1, T=11)
    kw = dict(max_new_tokens=25, pad_token_id=0, attention_mask=torch.ones_like(prompt))
    got = model.generate(prompt, do_sample=False, **kw, **{CACHE_ARG: EvaCache.for_config(model.config)})
    assert torch.equal(got, _recompute_greedy(model, prompt, 25))


def test_the_setting_is_carried_by_the_saved_folder(tmp_path):
    model = eva_llama(**SETTINGS, selected_positions="window", select_by="bound")
    model.save_pretrained(tmp_path)
    again = EvaLlamaForCausalLM.from_pretrained(tmp_path, torch_dtype=torch.float64).eval()
    assert again.config.eva_settings().select_chunks == 2 and again.config.placement().selected_positions == "window"
    assert again.config.eva_settings().select_by == "bound" and again.model.layers[0].self_attn.eva.layout.select_by == "bound"
    tokens = ids(T=40)
    assert (again(tokens, use_cache=False).logits - model(tokens, use_cache=False).logits).abs().max() <= EXACT
    plain = EvaLlamaForCausalLM.from_llama(hf_llama(), window_size=8, chunk_size=2)
    plain.load_state_dict(model.state_dict())
    assert (plain(tokens, use_cache=False).logits - model(tokens, use_cache=False).logits).abs().max() > 1e-3


def test_a_move_without_selection_or_with_a_wrapping_rotation_is_refused_in_one_line():
    for settings, said in [(dict(window_size=8, chunk_size=2, selected_positions="window"), "without select_chunks"),
                           (dict(**SETTINGS, selected_positions="window", positions="circular"), "needs positions='rope'"),
                           (dict(**SETTINGS, select_by="window-bound"), "set selected_positions='window'")]:
        with pytest.raises(ConfigError, match=said) as err:
            EvaLlamaForCausalLM.from_llama(hf_llama(), **settings)
        assert "\n" not in str(err.value)
