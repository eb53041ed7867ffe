"""The trained recall study's parts (benchmarks/recall.py, benchmarks/recall_ssm.py): Zoology's MQAR and
the passkey copy as generated, the Mamba twin against `transformers`' own forward, a resumed grid.

    python -m pytest tests/icl_eval/test_recall_study.py -q

Oracles: each sequence re-read here (every query's label is the value that followed its key in the
context; the copy's labels are the tokens after PASS); `MambaForCausalLM.forward` on the whole
sequence for the twin, whole and continued segment by segment from its state (float32).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from benchmarks import recall as study
from benchmarks.recall_ssm import MambaTwin

VOCAB = study.Vocab(64)


def test_mqar_is_zoologys_format_and_every_label_is_the_value_of_its_key():
    rng = np.random.default_rng(0)
    x, y = study.mqar(rng, 20, 64, 8, VOCAB)
    assert x.shape == y.shape == (20, 64)
    for row, labels in zip(x, y):
        keys, values = row[0:16:2], row[1:16:2]
        assert set(keys) <= set(range(*VOCAB.keys)) and set(values) <= set(range(*VOCAB.values))
        assert len(set(keys)) == 8
        asked = np.nonzero(labels != -100)[0]
        assert len(asked) == 8 and all(asked >= 16)
        for at in asked:  # the model sees the key at `at` and must give the value that followed it
            assert labels[at] == dict(zip(keys, values))[row[at]]


def test_the_copy_task_and_far_mqar_ask_what_the_context_holds():
    rng = np.random.default_rng(1)
    x, y = study.passkey(rng, 10, 64, VOCAB)
    for row, labels in zip(x, y):
        at = int(np.nonzero(row == VOCAB.pass_token)[0][0])
        asked = np.nonzero(labels != -100)[0]
        assert list(labels[asked]) == list(row[at + 1 : at + 1 + study.PASSKEY_TOKENS])
        assert row[asked[0]] == VOCAB.ask_token and asked[-1] == 63
    x, y = study.mqar_far(rng, 5, 300, VOCAB)
    for row, labels in zip(x, y):
        pairs = dict(zip(row[0:16:2], row[1:16:2]))
        asked = np.nonzero(labels != -100)[0]
        assert all(asked >= 300 - 16) and [labels[a] for a in asked] == [pairs[row[a]] for a in asked]


def test_the_mamba_twin_is_transformers_mamba_whole_and_in_segments():
    torch.manual_seed(0)
    twin = MambaTwin(66, 32, 2).eval()
    x = torch.randint(0, 66, (2, 70))
    with torch.no_grad():
        reference = twin.hf(input_ids=x).logits
        whole, _ = twin(x)
        state, parts = None, []
        for lo, hi in ((0, 1), (1, 2), (2, 33), (33, 70)):
            out, state = twin(x[:, lo:hi], state)
            parts.append(out)
    # float32 (the reference casts its discretised terms to float32 whatever the model's dtype): the same
    # recurrence summed in another order, logits of order 1
    assert (whole - reference).abs().max() < 1e-5
    assert (torch.cat(parts, 1) - reference).abs().max() < 1e-5


def test_a_grid_resumes_and_refuses_other_settings(tmp_path, capsys):
    args = ["--out", str(tmp_path), "--archs", "eva,mamba", "--widths", "16", "--steps", "3", "--checkpoint-every", "2",
            "--items", "2", "--long-items", "1", "--lengths", "64,128", "--train-kv", "4", "--test-kv", "4"]
    study.main(args)
    cells = sorted(p.name for p in (tmp_path / "cells").iterdir())
    assert cells == sorted(f"{a}-16-{t}.json" for a in ("eva", "eva-no-remote", "eva-chunk-window", "mamba")
                           for t in ("kv-4", "passkey-64", "passkey-128", "mqar_far-64", "mqar_far-128"))
    first = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "cells").iterdir()}
    study.main([*args, "--device", "cpu:0"])  # everything there: nothing retrained, nothing rewritten; the
    # device is where a model ran, not how it was trained (same data, same initial weights), so not "other settings"
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "cells").iterdir()} == first
    cell = json.loads((tmp_path / "cells" / "eva-16-kv-4.json").read_text())
    assert cell["chance"] == 1 / 64 and cell["context_guess"] == 1 / 4 and 0 <= cell["accuracy"] <= 1
    machine = study.device_name("cpu")  # each figure names its machine: the CPU's model name here
    assert cell["device"] == machine != "cpu" and json.loads((tmp_path / "models" / "eva-16.json").read_text())["device"] == machine
    with pytest.raises(SystemExit, match="other settings"):
        study.main([*args[:-2], "--test-kv", "8"])
    study.main(["--out", str(tmp_path), "--tables"])
    table = capsys.readouterr().out
    assert f"| eva | 16 | {json.loads((tmp_path / 'models' / 'eva-16.json').read_text())['params']:,} | {machine} |" in table
    assert "| eva | 16 |" in table and "| eva-no-remote | 16 |" in table and "| eva-chunk-window | 16 |" in table


@pytest.mark.parametrize("answer, accuracy, mates", [("own", "1.00", "0/0"), ("mate", "0.00", "256/256"),
                                                     ("other-chunk", "0.00", "0/256")])
def test_chunk_mates_counts_the_wrong_answers_that_a_chunk_summary_holds(tmp_path, monkeypatch, answer, accuracy, mates):
    """The diagnosis of where EVA's MQAR errors go, against answers built from the sequence itself: the
    queried pair's own value, its chunk-mate's (pairs 2j and 2j+1 share a chunk of 4), another chunk's."""
    study.main(["--out", str(tmp_path), "--archs", "eva", "--widths", "16", "--steps", "1", "--items", "1",
                "--long-items", "1", "--lengths", "64", "--train-kv", "4", "--test-kv", "4", "--ablations", ""])

    def answers(model, x, labelled):
        seq = x[0].numpy()
        keys, values = seq[0:32:2], seq[1:32:2]
        out = []
        for t in labelled:
            j = int(np.nonzero(keys == seq[t])[0][0])
            out.append(values[j if answer == "own" else j ^ 1 if answer == "mate" else (j + 2) % 16])
        return np.asarray(out)

    monkeypatch.setattr(study, "predict", answers)
    table = study.chunk_mates(tmp_path, kv=16, n=16)
    assert f"| eva-16 | {accuracy} | {mates} | 0.07 of them |" in table, table
