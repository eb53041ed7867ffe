"""`evalm convert` (train/convert.py) on a tiny Llama built here, against the original model, in float64.

    python -m pytest tests/train/test_convert.py -q

- A window over the whole input with the window's chunks excluded from the summaries is exact
  softmax attention: the converted folder, loaded as `transformers` loads it (remote code) and as
  the evaluator does (`--hf-model`), gives the original's logits to float64 rounding, without and
  through the cache, and greedy `generate()` gives the original's tokens, for every position
  scheme; with the 2023 rule (own chunks also summarised) it does not.
- The zero-step summary maps are what `eva.init` says: the identity makes a chunk's remote key its
  mean key and ω = q̄ + k̄; `mean-key` ω = k̄; `reference` neither.
- The position twins: `block` is RoPE at i mod w, `circular` at i mod M; past the first block
  they differ from `rope`, inside it they agree.
- A model that is not Llama-family, a shape EVA cannot take, and bad settings are one line, exit 2.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from evalm.train.convert import main, read_settings  # noqa: E402
from tests.train.llama_helpers import tiny_llama_folder  # noqa: E402

EXACT = 1e-10
TWINS = {"rope": [], "circular": ["--set", "eva.positions=\"circular\""], "block": ["--set", "eva.positions=\"block\""]}


def tokens(T: int = 48, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 63, (2, T), generator=torch.Generator().manual_seed(seed))


def convert(tmp_path, *settings: str, name: str = "eva"):
    """The tiny Llama (made once per test folder) and its conversion with `settings`, both loaded in float64:
    the converted one as `AutoModelForCausalLM` with the folder's remote code."""
    source = tmp_path / "llama"
    if not source.is_dir():
        tiny_llama_folder(source)
    assert main(["--hf-model", str(source), "--out", str(tmp_path / name), "--dtype", "float64", *settings]) == 0
    original = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float64).eval()
    eva = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / name, trust_remote_code=True,
                                                            dtype=torch.float64).eval()
    return original, eva


@pytest.mark.parametrize("twin", TWINS)
def test_a_window_over_the_input_with_its_chunks_excluded_is_the_original(tmp_path, twin):
    from evalm.icl_eval.models.hf import load_hf

    whole = ["--set", "eva.window_size=64", "--set", "eva.chunk_size=4", *TWINS[twin]]
    original, eva = convert(tmp_path, *whole)
    assert type(eva).__name__ == "EvaLlamaForCausalLM" and eva.config.model_type == "eva_llama"
    x = tokens()
    want = original(x, use_cache=False).logits
    assert (eva(x, use_cache=False).logits - want).abs().max() <= EXACT
    assert (eva(x).logits - want).abs().max() <= EXACT  # through the EvaCache
    evaluator = load_hf(tmp_path / "eva", dtype="float64")  # --hf-model: evalm's classes, no remote code
    assert (evaluator.forward(x) - want).abs().max() <= EXACT
    prompt = x[:1, :10]
    greedy = dict(max_new_tokens=30, do_sample=False, pad_token_id=0)
    assert torch.equal(eva.generate(prompt, **greedy), original.generate(prompt, **greedy))
    _, counted_twice = convert(tmp_path, *whole, "--set", "eva.exclude_window_chunks=false", name="twice")
    assert (counted_twice(x, use_cache=False).logits - want).abs().max() > 1e-3


def test_the_record_names_the_source_its_quantisation_and_the_settings(tmp_path):
    convert(tmp_path, "--set", "eva.window_size=8", "--set", "eva.chunk_size=4")
    record = json.loads((tmp_path / "eva" / "convert.json").read_text())
    assert record["source"] == str(tmp_path / "llama") and record["gguf_file"] is None
    assert record["quantisation"] == "none (float64 weights)"
    assert record["eva"] == {"window_size": 8, "chunk_size": 4, "overlap_window": False, "use_t5_bias": False,
                             "exclude_window_chunks": True, "sink_tokens": 0, "adaptive_proj": "no-ln",
                             "select_chunks": 0, "select_only": False, "select_by": "summary", "positions": "rope",
                             "circular_period": 0, "sink_positions": "own", "selected_positions": "own", "init": "identity"}
    config = json.loads((tmp_path / "eva" / "config.json").read_text())
    assert config["evalm"]["window_size"] == 8 and config["auto_map"]["AutoModelForCausalLM"].startswith("modeling_eva")


@pytest.mark.parametrize("init", ["identity", "mean-key", "reference"])
def test_the_zero_step_summary_maps_are_what_init_says(tmp_path, init):
    from evalm import summaries

    proj = ["--set", "eva.adaptive_proj=\"qk\""] if init == "reference" else []
    _, eva = convert(tmp_path, "--set", "eva.window_size=8", "--set", "eva.chunk_size=4",
                     "--set", f"eva.init=\"{init}\"", *proj)
    g = torch.Generator().manual_seed(1)
    q_mean, k_mean = (torch.randn(1, 4, 3, 8, generator=g, dtype=torch.float64) for _ in range(2))
    for layer in eva.model.layers:
        k_tilde, omega = summaries.keys(layer.self_attn.eva.maps, q_mean, k_mean, None)
        if init == "reference":
            assert (k_tilde - k_mean).abs().max() > 0.1
        else:
            assert torch.equal(k_tilde, k_mean)
            assert torch.equal(omega, q_mean + k_mean if init == "identity" else k_mean)


def test_the_position_twins_agree_in_the_first_block_and_differ_after_it(tmp_path):
    from evalm.llama_adapter import CircularRotary

    settings = ["--set", "eva.window_size=8", "--set", "eva.chunk_size=4"]
    _, rope = convert(tmp_path, *settings)
    _, block = convert(tmp_path, *settings, *TWINS["block"], name="block")
    _, circular = convert(tmp_path, *settings, *TWINS["circular"], "--set", "eva.circular_period=16", name="circular")
    assert isinstance(block.model.rotary_emb, CircularRotary) and block.model.rotary_emb.period == 8
    assert circular.model.rotary_emb.period == 16 and not isinstance(rope.model.rotary_emb, CircularRotary)
    x = tokens(T=40)
    want = rope(x, use_cache=False).logits
    for twin in (block, circular):
        got = twin(x, use_cache=False).logits
        assert (got[:, :8] - want[:, :8]).abs().max() <= EXACT  # one block, no summary: relative offsets alike
        assert (got[:, 16:] - want[:, 16:]).abs().max() > 1e-3


def _refused(capsys, args) -> str:
    capsys.readouterr()  # what building the inputs printed
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_what_convert_cannot_take_is_one_line(tmp_path, capsys):
    source = tiny_llama_folder(tmp_path / "llama")
    out = ["--out", str(tmp_path / "out")]
    gpt2 = tmp_path / "gpt2"
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64)).save_pretrained(gpt2)
    assert "model_type 'gpt2' is not Llama-family" in _refused(capsys, ["--hf-model", str(gpt2), *out])
    odd = tmp_path / "odd"
    odd.mkdir()
    config = json.loads((source / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 3}))
    assert "num_key_value_heads=3 does not divide" in _refused(capsys, ["--hf-model", str(odd), *out])
    assert "not found" in _refused(capsys, ["--hf-model", str(tmp_path / "none"), *out])
    for setting, said in [("eva.window_size=10", "--set eva: window_size=10 must be a positive multiple of chunk_size=16"),
                          ("eva.sink_tokens=6", "--set eva: sink_tokens=6 must be a multiple of chunk_size=16"),
                          ("eva.sink_positions=\"window\"", "sink_positions='window' without sink_tokens"),
                          ("eva.select_chunks=1000000000", "eva.select_chunks=1000000000: the selected tokens"),
                          ("eva.select_only=true", "select_only without select_chunks"),
                          ("eva.selected_positions=\"window\"", "selected_positions='window' without select_chunks"),
                          ("eva.select_by=\"window-bound\"", "select_by='window-bound' without select_chunks"),
                          ("eva.bogus=1", "bogus"),
                          ("eva.positions=\"sideways\"", "positions"),
                          ("eva.adaptive_proj=\"qk\"", "needs eva.adaptive_proj='no-ln'")]:
        assert said in _refused(capsys, ["--hf-model", str(source), *out, "--set", setting]), setting
    both = ["--set", "eva.positions=\"block\"", "--set", "eva.overlap_window=true"]
    assert "wrong offsets" in _refused(capsys, ["--hf-model", str(source), *out, *both])
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_one_eva_schema_for_the_model_the_converter_and_the_llama_config_and_no_torch_for_its_settings():
    """One settings class (evalm/eva_settings.py) held by `ModelConfig`, the conversion and the Llama config:
    no second declaration of EVA's fields; reading a conversion's settings and writing the `evalm` section
    imports neither torch nor transformers (--help, refusals)."""
    import dataclasses
    import subprocess
    import sys

    from evalm.config import ModelConfig
    from evalm.eva_settings import EVA_FIELDS, EvaSettings
    from evalm.train.convert import Conversion

    assert issubclass(ModelConfig, EvaSettings) and EVA_FIELDS == tuple(f.name for f in dataclasses.fields(EvaSettings))
    assert not set(EVA_FIELDS) & {f.name for f in dataclasses.fields(Conversion)}  # held as `eva`, not redeclared
    settings = read_settings(["eva.window_size=64", "eva.chunk_size=16", "eva.sink_tokens=16"])
    assert isinstance(settings.eva, EvaSettings) and settings.eva.exclude_window_chunks  # the conversion's start
    section = settings.evalm_section(8192)
    assert set(EVA_FIELDS) <= set(section) and section["sink_tokens"] == 16
    assert read_settings(["eva.positions=\"block\"", "eva.window_size=64"]).evalm_section(8192)["circular_period"] == 64
    code = ("import sys\nfrom evalm.train.convert import read_settings\n"
            "read_settings(['eva.window_size=64', 'eva.chunk_size=16']).evalm_section(8192)\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'loaded'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
