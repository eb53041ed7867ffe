"""Perplexity by a token's offset inside EVA's block (`evalm eval ppl --by-offset`) against hand-built per-token
losses, and the attention-sink test (`evalm eval sink`) against a converted model's own EVA paths.

    python -m pytest tests/icl_eval/test_sink.py -q
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import numpy as np
import pytest

from evalm.icl_eval.perplexity import sink as study
from evalm.icl_eval.perplexity.lengths import block_offsets


def test_block_offsets_read_each_token_where_it_sits_in_its_block():
    """nll[i] is the token at position i + 1: the first 16 of each 1,024-token block cost ln 10, the rest
    ln 2, and the first block (positions below 1,024, no whole block behind it) ln 1000, which must not show."""
    pos = np.arange(1, 3001)
    nll = np.where(pos < 1024, math.log(1000), np.where(pos % 1024 < 16, math.log(10), math.log(2)))
    got = {tuple(r["offsets"]): r["token_ppl"] for r in block_offsets([nll], 1024)}
    assert got == pytest.approx({(0, 16): 10.0, (16, 64): 2.0, (64, 256): 2.0, (256, 1024): 2.0})
    shifted = block_offsets([np.roll(nll, 1)], 1024)  # one position off: position 1,024 (offset 0) now costs ln 1000
    assert shifted[0]["token_ppl"] > 10.5
    two = block_offsets([nll, nll[:1500]], 1024)  # books pooled: token counts add up per offset range
    assert [r["tokens"] for r in two] == [32 + 16, 96 + 48, 384 + 192, 1465 + 221]


@pytest.mark.parametrize("overlap", [False, True])
def test_the_window_as_a_mask_is_the_conversion_without_its_summaries(tmp_path, overlap):
    """`evalm eval sink`'s oracle: the original softmax model under `window_mask` (no sink) gives the
    per-token losses of its EVA conversion read with `--eva-ablation no-remote` (EVA's own paths), block
    and overlap geometry; a sink of one token changes exactly the rows that did not see position 0."""
    transformers = pytest.importorskip("transformers")
    import torch

    from evalm.eva import ablate
    from evalm.train.convert import main as convert_main
    from tests.train.llama_helpers import tiny_llama_folder

    source = tiny_llama_folder(tmp_path / "llama", dtype="float32")
    extra = ["--set", "eva.overlap_window=true"] if overlap else []
    assert convert_main(["--hf-model", str(source), "--out", str(tmp_path / "eva"), "--set", "eva.window_size=8",
                         "--set", "eva.chunk_size=4", *extra]) == 0
    original = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    eva = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "eva", trust_remote_code=True).eval()
    assert ablate(eva, "no-remote") > 0
    tokens = [int(t) for t in torch.randint(0, original.config.vocab_size, (41,), generator=torch.Generator().manual_seed(3))]
    ext = 8 if overlap else 0
    with torch.no_grad():
        logits = eva(input_ids=torch.tensor([tokens[:-1]]), use_cache=False).logits[0]
    want = torch.nn.functional.cross_entropy(logits.double(), torch.tensor(tokens[1:]), reduction="none").numpy()
    got = study.masked_nll(original, tokens, study.window_mask(len(tokens), 8, ext, 0))
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    full = study.masked_nll(original, tokens, study.window_mask(len(tokens), 8, ext, len(tokens)))
    assert np.abs(full - want).max() > 1e-3  # the window is not softmax attention over everything
    sunk = study.masked_nll(original, tokens, study.window_mask(len(tokens), 8, ext, 1))
    sees_zero = np.array([max(0, q // 8 * 8 - ext) == 0 for q in range(len(tokens) - 1)])  # query q predicts token q+1
    np.testing.assert_allclose(sunk[sees_zero], got[sees_zero], rtol=0, atol=1e-6)
    assert (np.abs(sunk - got) > 1e-6)[~sees_zero].all()


@pytest.mark.parametrize("overlap", [False, True])
def test_a_conversion_with_sink_tokens_is_the_masked_sink_test_without_its_summaries(tmp_path, overlap):
    """`eva.sink_tokens=4` (EVA's own paths, evalm/tiling.py) read with `no-remote` gives the original
    under `window_mask` with a 4-token sink, per token; with its summaries it differs."""
    transformers = pytest.importorskip("transformers")
    import torch

    from evalm.eva import ablate
    from evalm.train.convert import main as convert_main
    from tests.train.llama_helpers import tiny_llama_folder

    source = tiny_llama_folder(tmp_path / "llama", dtype="float32")
    extra = ["--set", "eva.overlap_window=true"] if overlap else []
    assert convert_main(["--hf-model", str(source), "--out", str(tmp_path / "eva"), "--set", "eva.window_size=8",
                         "--set", "eva.chunk_size=4", "--set", "eva.sink_tokens=4", *extra]) == 0
    original = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    eva = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "eva", trust_remote_code=True).eval()
    tokens = [int(t) for t in torch.randint(0, original.config.vocab_size, (41,), generator=torch.Generator().manual_seed(3))]
    ids, target = torch.tensor([tokens[:-1]]), torch.tensor(tokens[1:])

    def nll():
        with torch.no_grad():
            logits = eva(input_ids=ids, use_cache=False).logits[0]
        return torch.nn.functional.cross_entropy(logits.double(), target, reduction="none").numpy()

    with_summaries = nll()
    assert ablate(eva, "no-remote") > 0
    want = nll()
    ext = 8 if overlap else 0
    np.testing.assert_allclose(study.masked_nll(original, tokens, study.window_mask(len(tokens), 8, ext, 4)), want,
                               rtol=0, atol=2e-5)
    no_sink = study.masked_nll(original, tokens, study.window_mask(len(tokens), 8, ext, 0))
    assert np.abs(no_sink - want).max() > 1e-3 and np.abs(with_summaries - want).max() > 1e-3


def _book(tmp_path: Path, words: int) -> Path:
    """A book of the tiny Llama's own words (t0 … t62), seeded."""
    rng = np.random.default_rng(5)
    book = tmp_path / "book.txt"
    book.write_text(" ".join(f"t{i}" for i in rng.integers(1, 62, words)) + "\n")
    return book


def test_ppl_by_offset_regroups_the_models_own_losses_and_past_positions_is_asked_for(tmp_path, capsys):
    """`evalm eval ppl --by-offset 32` on a model of 64 positions, scored to 128 tokens: refused past its
    positions unless `--ppl.past_positions=true`; then each offset range's perplexity is the one of the
    transformers model's own whole-sequence forward (the oracle: no cache, no segments) over the positions
    from 32 on whose offset in their 32-token block lies in the range."""
    pytest.importorskip("transformers")
    import json

    import torch
    import transformers

    from evalm.icl_eval.cli import main as eval_main
    from tests.train.llama_helpers import tiny_llama_folder

    model = tiny_llama_folder(tmp_path / "llama", dtype="float32", max_position_embeddings=64)
    book = _book(tmp_path, 300)
    flags = ["ppl", "--hf-model", str(model), "--books", str(book), "--lengths", "64,128", "--by-offset", "32",
             "--ppl.baselines=[]", "--ppl.segment_tokens=48"]
    assert eval_main([*flags, "--out", str(tmp_path / "refused")]) == 2
    assert "past_positions" in capsys.readouterr().err
    assert eval_main([*flags, "--ppl.past_positions=true", "--out", str(tmp_path / "ppl")]) == 0
    rows = json.loads((tmp_path / "ppl" / "results.json").read_text())["protocols"]["cached"]["block_offsets"]

    hf = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(model)
    tokens = ([tok.eos_token_id] + tok(book.read_text())["input_ids"])[:129]
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor([tokens[:-1]])).logits[0]
    nll = torch.nn.functional.cross_entropy(logits.double(), torch.tensor(tokens[1:]), reduction="none").numpy()
    pos = np.arange(1, 129)
    want = {}
    for lo, hi in ((0, 16), (16, 32)):
        keep = (pos >= 32) & (pos % 32 >= lo) & (pos % 32 < hi)
        want[(lo, hi)] = (int(keep.sum()), math.exp(nll[keep].mean()))
    got = {tuple(r["offsets"]): (r["tokens"], r["token_ppl"]) for r in rows}
    assert got.keys() == want.keys() and [g[0] for g in got.values()] == [49, 48]
    for key, (count, ppl) in want.items():
        assert got[key][0] == count and got[key][1] == pytest.approx(ppl, rel=1e-4)  # float32 logits, cache vs one pass
    capsys.readouterr()
    assert eval_main(["tables", str(tmp_path / "ppl" / "results.json")]) == 0  # the run's markdown, offsets included
    table = capsys.readouterr().out
    assert "| cached |" in table and "| [0, 16) | [16, 32) |" in table and f"{want[(0, 16)][1]:.1f}" in table


def test_the_sink_command_writes_a_row_per_geometry_and_sink(tmp_path):
    """`evalm eval sink`: the rows of block and overlap x each sink, each as `masked_nll` gives it."""
    pytest.importorskip("transformers")
    import json

    from evalm.icl_eval.cli import main as eval_main
    from tests.train.llama_helpers import tiny_llama_folder

    model = tiny_llama_folder(tmp_path / "llama", dtype="float32")
    book = _book(tmp_path, 40)
    assert eval_main(["sink", "--hf-model", str(model), "--book", str(book), "--max-tokens", "32", "--window", "8",
                      "--sinks", "0,1", "--out", str(tmp_path / "sink")]) == 0
    result = json.loads((tmp_path / "sink" / "results.json").read_text())
    assert [(r["window"], r["sink"]) for r in result["rows"]] == [("block", 0), ("block", 1), ("overlap", 0), ("overlap", 1)]
    assert result["tokens"] == 32 and all(r["block_offsets"] for r in result["rows"])
    assert result["rows"][0]["buckets"] != result["rows"][1]["buckets"]  # the sink changes what blocks 2.. see


def test_the_conversion_studys_perplexity_and_sink_steps_are_commands_that_parse(tmp_path, capfd):
    """configs/study-convert.toml's `ppl-*` and `sink` steps: every flag and override is one their command
    reads (each is refused only for the model folder a fresh root lacks, in one line), and every model they
    read is the output of an earlier step."""
    from evalm.launcher.cli import main as evalm
    from evalm.launcher.study_file import load_study

    steps = load_study("configs/study-convert.toml", root=str(tmp_path)).steps
    made, measured = [], 0
    for step in steps:
        argv = step.argv
        if argv[:2] in (["eval", "ppl"], ["eval", "sink"]):
            model = argv[argv.index("--hf-model") + 1]
            assert any(model == m or model.startswith(m + "/") for m in made), (step.name, model)
            with pytest.raises(SystemExit) if argv[1] == "sink" else contextlib.nullcontext():
                assert evalm(argv) == 2
            err = capfd.readouterr().err.strip().splitlines()
            assert len(err) == 1 and "--hf-model" in err[0] and "no such folder" in err[0], (step.name, err)
            measured += 1
        made += [a for flag, a in zip(argv, argv[1:]) if flag in ("--out", "--output")]
    assert measured == 10  # 5 perplexity readings of the conversions, 4 with selection, the sink test
