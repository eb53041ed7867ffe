"""An exported EVALM through `transformers`: the evaluator's `--hf-model` path and lm-eval's `hf` model.

    python -m pytest tests/icl_eval/test_hf_eva.py -q

One tiny EVALM (T5 bias, windows of 8, a circular period of 64 that long prompts wrap) exported with
`evalm export --hf`. Oracles, float64 on both sides:
- the methods (concat, incremental in segments, Structured Prompting's merge over 3 groups) score
  the same through `load_hf(folder)` (the `EvaCache`, its forks and merges) as through `EvalmLM`
  (`EvalmModel` and evalm's cache), and the caches hold the same bytes;
- lm-eval's own HF backend (`HFLM(pretrained=folder, trust_remote_code=True)`) gives the project's
  harness backend's loglikelihoods (to 1e-9) and generations over the exported EVALM, and its
  rolling loglikelihoods over the folder loaded by `--hf-model`, request by request; and `lm_eval --model hf --model_args pretrained=folder,trust_remote_code=True` run for
  real on a local task logs the loglikelihoods the harness backend computes for the same requests.
A Llama with EVA saved by `save_pretrained` scores alike through `--hf-model` on every path (one
shot, in segments, one merged group), and a head layout EVA cannot take is one line naming the
folder's config.json and the field.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from evalm import ModelConfig  # noqa: E402
from evalm.io import load_model, save_model  # noqa: E402
from evalm.launcher.cli import main as evalm  # noqa: E402
from evalm.text.tokenizer import ByteTokenizer  # noqa: E402
from evalm.icl_eval.methods.decoder import METHODS, MethodOptions  # noqa: E402
from evalm.icl_eval.models.lm import EvalmLM  # noqa: E402
from tests.icl_eval.conftest import demos_and_items  # noqa: E402
from tests.icl_eval.test_harness import TASK_YAML  # noqa: E402
from tests.models import visible_model  # noqa: E402

TOL = 1e-9


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(exported EVALM, its `evalm export --hf` folder)."""
    root = tmp_path_factory.mktemp("hf-eva")
    config = ModelConfig(vocab_size=257, d_model=32, n_layer=2, n_head=4, d_ff=64, window_size=8, chunk_size=4,
                         circular_period=64, use_t5_bias=True, dropout=0.0, attn_dropout=0.0)
    save_model(visible_model(config, seed=3), root / "model")
    assert evalm(["export", "--hf", "--checkpoint", str(root / "model"), "--out", str(root / "hf")]) == 0
    return root / "model", root / "hf"


def _pair(folders):
    from evalm.icl_eval.models.hf import load_hf

    model, hf = folders
    return (EvalmLM(load_model(model, dtype=torch.float64), ByteTokenizer()),
            load_hf(hf, tokenizer=ByteTokenizer(), dtype="float64"))


def test_the_evaluator_drives_the_transformers_model_through_the_eva_cache(folders, synth):
    ours, hf = _pair(folders)
    assert type(hf).__name__ == "EvaHFCausalLM" and hf.max_positions is None
    prompt, splits = synth
    demos, items = demos_and_items(prompt, splits, 24)
    for name, opts in (("concat", {}), ("incremental", {"segment_tokens": 7}), ("structured", {"n_groups": 3})):
        want = np.array(METHODS[name](ours, prompt, demos, items, MethodOptions(**opts)).scores)
        got = np.array(METHODS[name](hf, prompt, demos, items, MethodOptions(**opts)).scores)
        assert np.abs(got - want).max() <= TOL, name
        assert np.ptp(want) > 1e-3
    tokens = torch.tensor([prompt.tokenizer.encode("x" * 150)])
    states = [lm.new_state() for lm in (ours, hf)]
    for lm, state in zip((ours, hf), states):
        lm.extend(state, tokens)
    kids = [lm.fork(state, batch_size=3) for lm, state in zip((ours, hf), states)]
    more = torch.randint(0, 256, (3, 5), generator=torch.Generator().manual_seed(0))
    a, b = (lm.extend(kid, more) for lm, kid in zip((ours, hf), kids))
    assert (a - b).abs().max() <= TOL and ours.nbytes(kids[0]) == hf.nbytes(kids[1])
    assert ours.nbytes(states[0]) == hf.nbytes(states[1]) > 0


def _instances(request_type, args_list):
    from lm_eval.api.instance import Instance

    return [Instance(request_type=request_type, doc={}, arguments=a, idx=i) for i, a in enumerate(args_list)]


DEMOS = "Question: what is one plus one? Answer: two.\nQuestion: what is two plus two? Answer:"
PAIRS = [(DEMOS, " four."), (DEMOS, " five."), ("The quick brown", " fox jumps over the lazy dog"), ("x", " y")]


def test_lm_evals_hf_model_gives_the_harness_backends_numbers(folders):
    pytest.importorskip("lm_eval")
    from lm_eval.models.huggingface import HFLM

    from evalm.icl_eval.harness import harness_lm
    from evalm.icl_eval.models.hf import load_hf

    model, hf = folders
    theirs = HFLM(pretrained=str(hf), device="cpu", batch_size=2, dtype="float64", trust_remote_code=True)
    ours = harness_lm(EvalmLM(load_model(model, dtype=torch.float64), ByteTokenizer()), batch_size=3)
    assert theirs.prefix_token_id == ours.prefix_token_id == 256 and ours.add_bos
    want = theirs.loglikelihood(_instances("loglikelihood", PAIRS), disable_tqdm=True)
    got = ours.loglikelihood(_instances("loglikelihood", PAIRS), disable_tqdm=True)
    assert max(abs(g[0] - w[0]) for g, w in zip(got, want)) <= TOL and [g[1] for g in got] == [w[1] for w in want]
    # rolling: lm-eval scores a bos-adding tokenizer's bos after its prefix token (as for Llama); the
    # backend over the folder's own tokenizer does the same, while EVALM's does not double it
    via_folder = harness_lm(load_hf(hf, dtype="float64"), batch_size=3)
    docs = [(DEMOS * 3,), ("The quick brown fox jumps over the lazy dog. " * 4,)]
    want = theirs.loglikelihood_rolling(_instances("loglikelihood_rolling", docs), disable_tqdm=True)
    got = via_folder.loglikelihood_rolling(_instances("loglikelihood_rolling", docs), disable_tqdm=True)
    assert max(abs(g - w) for g, w in zip(got, want)) <= TOL
    gen = [(DEMOS, {"until": ["\n"], "max_new_tokens": 12}), ("The quick", {"until": ["zzz"], "max_new_tokens": 30})]
    assert theirs.generate_until(_instances("generate_until", gen), disable_tqdm=True) == \
        ours.generate_until(_instances("generate_until", gen), disable_tqdm=True)


# ~20 s on 2 cores; lm-eval's simple_evaluate and CLI on a local task (tests/icl_eval/test_harness.py) stay in CI
@pytest.mark.slow
def test_the_lm_eval_command_on_a_local_task(folders, tmp_path):
    """`lm_eval --model hf` for real (its own process, its own task loading), its logged
    loglikelihoods compared with the harness backend's for the same requests."""
    pytest.importorskip("lm_eval")
    from evalm.icl_eval.harness import harness_lm

    model, hf = folders
    for split, numbers in (("train", range(10)), ("test", range(10, 16))):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps({"x": n, "y": n % 2}) + "\n" for n in numbers))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "local_parity.yaml").write_text(TASK_YAML.format(data=tmp_path))
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf-home")}
    done = subprocess.run(
        [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args",
         f"pretrained={hf},trust_remote_code=True,dtype=float64", "--tasks", "local_parity", "--include_path",
         str(tmp_path / "tasks"), "--num_fewshot", "3", "--device", "cpu", "--batch_size", "2", "--log_samples",
         "--output_path", str(tmp_path / "out"), "--seed", "1"],
        capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    [samples] = list((tmp_path / "out").rglob("samples_local_parity*.jsonl"))
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    requests = [tuple(arg.values()) for row in rows for arg in row["arguments"].values()]
    logged = [resp[0][0] for row in rows for resp in row["resps"]]
    assert len(rows) == 6 and len(requests) == len(logged) == 12
    ours = harness_lm(EvalmLM(load_model(model, dtype=torch.float64), ByteTokenizer()), batch_size=4)
    got = [ll for ll, _ in ours.loglikelihood(_instances("loglikelihood", requests), disable_tqdm=True)]
    assert max(abs(g - float(w)) for g, w in zip(got, logged)) <= TOL


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    """A tiny Llama with EVA (grouped-query heads, RoPE, circular positions of period 64) saved by
    `save_pretrained`: model_type "eva_llama", the `evalm` settings in its config.json."""
    from evalm.hf_llama import EvaLlamaForCausalLM
    from tests.models import hf_llama

    folder = tmp_path_factory.mktemp("eva-llama") / "model"
    model = EvaLlamaForCausalLM.from_llama(hf_llama(vocab_size=300), window_size=8, chunk_size=4, use_t5_bias=True,
                                           positions="circular", circular_period=64)
    model.save_pretrained(folder)
    return folder


def test_an_eva_llama_folder_through_hf_model_scores_alike_on_every_path(llama_folder, synth):
    from evalm.icl_eval.models.hf import load_hf

    lm = load_hf(llama_folder, tokenizer=ByteTokenizer(), dtype="float64")
    assert type(lm).__name__ == "EvaHFCausalLM" and lm.model.config._attn_implementation == "eva"
    prompt, splits = synth
    demos, items = demos_and_items(prompt, splits, 24)
    scores = {name: np.array(METHODS[name](lm, prompt, demos, items, MethodOptions(**opts)).scores)
              for name, opts in (("concat", {}), ("incremental", {"segment_tokens": 5}), ("structured", {"n_groups": 1}))}
    assert np.abs(scores["incremental"] - scores["concat"]).max() <= TOL
    assert np.abs(scores["structured"] - scores["concat"]).max() <= TOL and np.ptp(scores["concat"]) > 1e-3


def test_a_layout_eva_cannot_take_is_one_line_through_evalm_eval(llama_folder, tmp_path, capsys):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(llama_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 3}))
    assert evalm(["eval", "icl", "--hf-model", str(folder), "--tokenizer", "bytes", "--shots", "0",
                  "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{folder / 'config.json'}: num_key_value_heads=3 does not divide" in err
