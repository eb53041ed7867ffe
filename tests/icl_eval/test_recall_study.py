"""The recall study's data, its Mamba twin and its test cells (`evalm eval recall-cells`), and the tables
`evalm eval recall-tables` prints from them.

    python -m pytest tests/icl_eval/test_recall_study.py -q

Oracles: each sequence re-read here (every query's label is the value that followed its key in the
context; the copy's labels are the tokens after PASS); `MambaForCausalLM.forward` on the whole
sequence for the twin, whole and continued segment by segment from its state (float32); for the
cells, the model's own one-shot forward scored here (greedy answers at the labelled positions).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from evalm.icl_eval.recall import chunk_mates as study
from evalm.config_toolkit import UserError
from evalm.launcher.cli import main as evalm
from evalm.mamba_twin import MambaTwin
from evalm.recall_models import load_trained
from evalm.text.recall_data import PASSKEY_TOKENS, Vocab, mqar, mqar_far, passkey, training_batch

VOCAB = Vocab(64)


def test_mqar_is_zoologys_format_and_every_label_is_the_value_of_its_key():
    rng = np.random.default_rng(0)
    x, y = mqar(rng, 20, 64, 8, VOCAB)
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
    x, y = passkey(rng, 10, 64, VOCAB)
    for row, labels in zip(x, y):
        at = int(np.nonzero(row == VOCAB.pass_token)[0][0])
        asked = np.nonzero(labels != -100)[0]
        assert list(labels[asked]) == list(row[at + 1 : at + 1 + PASSKEY_TOKENS])
        assert row[asked[0]] == VOCAB.ask_token and asked[-1] == 63
    x, y = mqar_far(rng, 5, 300, VOCAB)
    for row, labels in zip(x, y):
        pairs = dict(zip(row[0:16:2], row[1:16:2]))
        asked = np.nonzero(labels != -100)[0]
        assert all(asked >= 300 - 16) and [labels[a] for a in asked] == [pairs[row[a]] for a in asked]


def test_a_training_batch_is_mqar_rows_then_copy_rows_in_the_share_asked():
    x, y = training_batch(np.random.default_rng(2), batch_size=8, seq_len=64, train_kv=(4, 8), mqar_share=0.75,
                          vocab=VOCAB)
    assert x.shape == y.shape == (8, 64)
    copy_rows = [bool((row == VOCAB.ask_token).any()) for row in x]
    assert copy_rows == [False] * 6 + [True] * 2
    assert all(int((labels != -100).sum()) in (4, 8) for labels in y[:6])  # kv drawn from train_kv per row


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


TRAIN = ["train", "recall", "--width", "16", "--steps", "3", "--checkpoint-every", "2", "--train-kv", "4"]
CELLS = ["eval", "recall-cells", "--items", "3", "--long-items", "1", "--long-from", "64", "--lengths", "64,128",
         "--test-kv", "4"]


def _train(tmp_path, arch: str):
    assert evalm([*TRAIN, "--arch", arch, "--out", str(tmp_path / "models" / f"{arch}-16")]) == 0
    return tmp_path / "models" / f"{arch}-16"


def _accuracy_by_hand(model, test: str, x_value: int, n: int) -> float:
    """The cell's accuracy from the model's one-shot forward (no cache, no segments)."""
    rng = np.random.default_rng([0, 1_000_003, ("kv", "passkey", "mqar_far").index(test), x_value])
    vocab = Vocab(128)
    x, y = mqar(rng, n, 64, x_value, vocab) if test == "kv" else (passkey if test == "passkey" else mqar_far)(
        rng, n, x_value, vocab)
    with torch.no_grad():
        guesses = model(torch.from_numpy(x)).argmax(-1).numpy()
    scores = [(guesses[i] == y[i])[y[i] != -100] for i in range(n)]
    return float(np.mean([s.all() if test == "passkey" else s.mean() for s in scores]))


def test_the_cells_of_a_trained_model_resume_and_refuse_other_settings(tmp_path):
    model_dir, out = _train(tmp_path, "eva"), tmp_path / "cells" / "eva-16"
    assert evalm([*CELLS, "--model", str(model_dir), "--out", str(out)]) == 0
    names = sorted(p.name for p in out.glob("*-16-*.json"))
    assert names == sorted(f"{a}-16-{t}.json" for a in ("eva", "eva-no-remote", "eva-chunk-window")
                           for t in ("kv-4", "passkey-64", "passkey-128", "mqar_far-64", "mqar_far-128"))
    model, _, _ = load_trained(model_dir)
    for name, test, x_value, n in (("kv-4", "kv", 4, 3), ("mqar_far-64", "mqar_far", 64, 3),
                                   ("passkey-128", "passkey", 128, 1)):
        cell = json.loads((out / f"eva-16-{name}.json").read_text())
        assert cell["items"] == n and cell["accuracy"] == _accuracy_by_hand(model, test, x_value, n)
    cell = json.loads((out / "eva-16-kv-4.json").read_text())
    assert cell["chance"] == 1 / 64 and cell["context_guess"] == 1 / 4
    first = {p.name: p.stat().st_mtime_ns for p in out.glob("*.json")}
    assert evalm([*CELLS, "--model", str(model_dir), "--out", str(out), "--device", "cpu:0"]) == 0  # where, not how
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.json")} == first  # every cell there: none rewritten
    assert evalm([*CELLS, "--model", str(model_dir), "--out", str(out), "--items", "4"]) == 2  # one line, refused
    with pytest.raises(UserError, match="no finished"):
        load_trained(tmp_path / "models" / "nothing")


def test_the_tables_and_the_chunk_mates_read_the_study_folder(tmp_path, capsys):
    for arch in ("eva", "window"):
        assert evalm([*CELLS, "--ablations", "", "--model", str(_train(tmp_path, arch)),
                      "--out", str(tmp_path / "cells" / f"{arch}-16")]) == 0
    capsys.readouterr()
    assert evalm(["eval", "recall-tables", "--root", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    log = json.loads((tmp_path / "models" / "eva-16" / "log.json").read_text())
    assert f"| eva | 16 | {log['params']:,} | {log['device']} |" in table and "| window | 16 |" in table
    kv = json.loads((tmp_path / "cells" / "window-16" / "window-16-kv-4.json").read_text())
    assert f"| window | 16 | {kv['accuracy']:.2f} [{kv['ci95'][0]:.2f}, {kv['ci95'][1]:.2f}] |" in table


@pytest.mark.parametrize("answer, accuracy, mates", [("own", "1.00", "0/0"), ("mate", "0.00", "256/256"),
                                                     ("other-chunk", "0.00", "0/256")])
def test_chunk_mates_counts_the_wrong_answers_that_a_chunk_summary_holds(tmp_path, monkeypatch, answer, accuracy, mates):
    """The diagnosis of where EVA's MQAR errors go, against answers built from the sequence itself: the
    queried pair's own value, its chunk-mate's (pairs 2j and 2j+1 share a chunk of 4), another chunk's."""
    _train(tmp_path, "eva")

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
