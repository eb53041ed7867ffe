"""benchmarks/convert.py's reading of perplexity by a token's offset inside EVA's block (not the runs: they
need SmolLM2), against hand-built per-token losses.

    python -m pytest tests/train/test_convert_study.py -q
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks import convert as study


def test_block_offsets_read_each_token_where_it_sits_in_its_block():
    """nll[i] is the token at position i + 1: the first 16 of each 1,024-token block cost ln 10, the rest
    ln 2, and the first block (positions below 1,024, no whole block behind it) ln 1000, which must not show."""
    pos = np.arange(1, 3001)
    nll = np.where(pos < 1024, math.log(1000), np.where(pos % 1024 < 16, math.log(10), math.log(2)))
    got = study.by_block_offset(nll)
    assert got == pytest.approx({"[0, 16)": 10.0, "[16, 64)": 2.0, "[64, 256)": 2.0, "[256, 1024)": 2.0})
    shifted = study.by_block_offset(np.roll(nll, 1))  # one position off: position 1,024 (offset 0) now costs ln 1000
    assert shifted["[0, 16)"] > 10.5


def test_recall_at_other_lengths_has_its_own_run_folder(tmp_path):
    """The study's grid keeps ROOT/recall/MODEL; a first pass at fewer lengths gets a folder of its own (a
    folder holds one grid), and the lengths reach `evalm eval recall` once."""
    cmd, out = study.eval_command(tmp_path, "eva-rope-0", "recall")
    assert out == tmp_path / "recall" / "eva-rope-0"
    assert cmd[cmd.index("--lengths") + 1] == "1024,4096,16384" and cmd.count("--lengths") == 1
    cmd, out = study.eval_command(tmp_path, "eva-rope-0", "recall", "1024,4096")
    assert out == tmp_path / "recall" / "eva-rope-0-1024-4096"
    assert cmd[cmd.index("--lengths") + 1] == "1024,4096" and cmd[cmd.index("--out") + 1] == str(out)
    cmd, out = study.eval_command(tmp_path, "original", "icl", "1024,4096")  # icl has no lengths: one folder
    assert out == tmp_path / "icl" / "original" and "--lengths" not in cmd
    cmd, out = study.eval_command(tmp_path, "eva-rope-0", "recall", "16384", depths="100", ablation="no-remote")
    assert out == tmp_path / "recall" / "eva-rope-0-no-remote-16384-d100"
    assert cmd[cmd.index("--depths") + 1] == "100" and cmd.count("--depths") == 1
    assert "--recall.eva_ablation=no-remote" in cmd
    assert "--depths" not in study.eval_command(tmp_path, "original", "icl")[0]


def test_evaluations_on_a_gpu_name_the_device_in_each_commands_own_section(tmp_path, capsys):
    """`--device cuda` reaches `evalm eval recall` as recall.device and `evalm eval icl` as eval.device (the
    fields each command's --help lists); on the CPU nothing is added."""
    from evalm.icl_eval.cli import main as eval_main

    for what, field in (("recall", "recall.device"), ("icl", "eval.device")):
        cmd, _ = study.eval_command(tmp_path, "eva-rope-0", what, device="cuda")
        assert [a for a in cmd if "device" in a] == [f"--{field}=cuda"]
        assert not [a for a in study.eval_command(tmp_path, "eva-rope-0", what)[0] if "device" in a]
        with pytest.raises(SystemExit):
            eval_main([what, "--help"])
        assert f"{field} = 'cpu'" in capsys.readouterr().out


@pytest.mark.parametrize("overlap", [False, True])
def test_the_window_as_a_mask_is_the_conversion_without_its_summaries(tmp_path, overlap):
    """`convert.py sink`'s oracle: the original softmax model under `window_mask` (no sink) gives the
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


def test_a_refused_evaluation_is_evalms_one_line_and_its_exit_code(tmp_path, capfd):
    """A bad `--lengths` reaches `evalm eval recall`, which refuses it in one line; the study exits with
    its code, adds no traceback, and writes nothing under --root."""
    with pytest.raises(SystemExit) as stop:
        study.main(["recall", "--model", "eva-rope-0", "--lengths", "abc", "--root", str(tmp_path / "study")])
    err = capfd.readouterr().err.strip()
    assert stop.value.code == 2 and "--lengths" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "study").exists()


def test_the_studys_evaluations_are_the_scripts_and_every_model_is_made_by_a_step():
    """configs/study-convert.toml's `evalm eval` steps are the commands `icl` / `recall` here run and time
    (`eval_command`: the same grid, the same run folder), and every model this script reads is an output of a
    step. (Before plan() went, the study was checked against its 56 commands: the commit that added the file.)"""
    from evalm.launcher.study_file import load_study

    root = Path("/ROOT")
    steps = load_study("configs/study-convert.toml", root=str(root)).steps
    model_of = {str(root / folder): model for model, folder in reversed(study.MODELS.items())}  # original, not -window
    evals = [s.argv for s in steps if s.argv[0] == "eval"]
    assert len(evals) == 20  # 7 icl, 13 recall
    for argv in evals:
        value = dict(zip(argv, argv[1:]))
        ablation = next((a.split("=", 1)[1] for a in argv if a.startswith("--recall.eva_ablation=")), "none")
        cmd, _ = study.eval_command(root, model_of[value["--hf-model"]], argv[1], value.get("--lengths", study.RECALL_LENGTHS),
                                    "cpu", value.get("--depths", study.RECALL_DEPTHS), ablation)
        assert cmd[1:] == argv
    made = [a for s in steps for flag, a in zip(s.argv, s.argv[1:]) if flag in ("--out", "--output")]
    for model, folder in study.MODELS.items():
        assert any(str(root / folder) == m or str(root / folder).startswith(m + "/") for m in made), model
