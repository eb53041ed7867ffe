"""`evalm train recall` (train/recall.py): the recall study's models trained through the trainer's step,
resumed bit for bit, and the study file configs/study-recall.toml whose steps are such commands.

    python -m pytest tests/train/test_recall_training.py -q

Oracles: the study's loop as benchmarks/recall.py ran it before it moved into the package, written
out here (AdamW over every parameter, its warm-up and cosine LR, the mean cross-entropy, the clip,
the update), against which the trainer's step must give the same weights; an uninterrupted run
against one killed after its first checkpoint and rerun.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from evalm.config_toolkit.files import read_toml
from evalm.icl_eval.recall import study_cells
from evalm.launcher.cli import main as evalm
from evalm.recall_models import StudyShape, logits_of, study_model
from evalm.text.recall_data import Vocab, training_batch
from evalm.train import recall

SMALL = ["--width", "16", "--steps", "6", "--checkpoint-every", "2", "--train-kv", "4", "--batch-size", "8"]


def _reference_loop(arch: str, steps: int) -> dict:
    """The study's loop before the package: its own optimiser, schedule, loss and clip (width 16)."""
    lr = 3e-3
    model = study_model(StudyShape(arch, 16, vocab_size=Vocab(128).size, n_layer=2, window=16, chunk=4, seq_len=64,
                                   seed=0))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.98))
    rng, warm = np.random.default_rng([0, 16]), max(1, steps // 20)
    model.train()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = (lr * (step + 1) / warm if step < warm else
                           lr * (0.1 + 0.45 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))))
        x, y = (torch.from_numpy(a) for a in training_batch(rng, batch_size=8, seq_len=64, train_kv=(4,),
                                                              mqar_share=0.75, vocab=Vocab(128)))
        loss = F.cross_entropy(logits_of(model, x).flatten(0, 1).float(), y.flatten(), ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model.state_dict()


def _weights(folder) -> dict:
    return torch.load(folder / "checkpoint.pt", weights_only=True)["model"]


@pytest.mark.parametrize("arch", ["eva", "mamba"])
def test_the_trainer_step_trains_the_model_the_studys_own_loop_trained(tmp_path, arch):
    assert evalm(["train", "recall", "--arch", arch, *SMALL, "--out", str(tmp_path / arch)]) == 0
    ours, reference = _weights(tmp_path / arch), _reference_loop(arch, 6)
    # The same batches, LR, gradients and update: equal bit for bit here (token-sum x 1/n and the mean
    # reduce alike on one CPU thread); 1e-6 leaves room for another reduction order, while the main job's
    # optimiser (no decay on norms and biases) or its linear schedule moves weights by ~1e-4 in 6 steps.
    for name, tensor in reference.items():
        torch.testing.assert_close(ours[name], tensor, atol=1e-6, rtol=0, msg=name)
    log = json.loads((tmp_path / arch / "log.json").read_text())
    built = study_model(StudyShape(arch, 16, vocab_size=130, n_layer=2, window=16, chunk=4, seq_len=64, seed=0))
    assert log["steps"] == 6 and len(log["loss"]) == 6 and log["params"] == sum(p.numel() for p in built.parameters())


def test_a_run_killed_after_a_checkpoint_resumes_bit_for_bit(tmp_path, monkeypatch):
    assert evalm(["train", "recall", "--arch", "window", *SMALL, "--out", str(tmp_path / "whole")]) == 0
    drawn = []
    real = recall.RecallBatches.next_batch

    def dies_at_the_fourth(self):  # a kill after step 3 (the checkpoint of step 2 on disk)
        drawn.append(1)
        if len(drawn) == 4:
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(recall.RecallBatches, "next_batch", dies_at_the_fourth)
    assert evalm(["train", "recall", "--arch", "window", *SMALL, "--out", str(tmp_path / "killed")]) == 130
    assert torch.load(tmp_path / "killed" / "checkpoint.pt", weights_only=True)["step"] == 2
    monkeypatch.undo()
    assert evalm(["train", "recall", "--arch", "window", *SMALL, "--out", str(tmp_path / "killed")]) == 0
    whole, resumed = _weights(tmp_path / "whole"), _weights(tmp_path / "killed")
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)
    before = (tmp_path / "killed" / "checkpoint.pt").stat().st_mtime_ns
    assert evalm(["train", "recall", "--arch", "window", *SMALL, "--out", str(tmp_path / "killed"),
                  "--device", "cpu:0"]) == 0  # done: nothing retrained; the device is where, not how
    assert (tmp_path / "killed" / "checkpoint.pt").stat().st_mtime_ns == before


def test_other_settings_and_bad_flags_are_one_line(tmp_path, capsys):
    out = str(tmp_path / "m")
    assert evalm(["train", "recall", "--arch", "window", *SMALL, "--out", out]) == 0
    assert evalm(["train", "recall", "--arch", "window", *SMALL, "--lr", "1e-3", "--out", out]) == 2
    assert "lr" in capsys.readouterr().err
    assert evalm(["train", "recall", "--arch", "gru", "--width", "16", "--out", str(tmp_path / "g")]) == 2
    assert evalm(["train", "recall", "--arch", "eva", "--width", "16", "--train-kv", "32",
                  "--out", str(tmp_path / "k")]) == 2
    err = capsys.readouterr().err
    assert "one of eva, full, window, mamba" in err and "Zoology's constraint" in err and "Traceback" not in err


STUDY = "configs/study-recall.toml"
PARSERS = {("train", "recall"): recall.parser, ("eval", "recall-cells"): study_cells.parser}
"""The real parser of each command a step of the study names."""


def test_the_study_file_lists_the_grid_as_steps_of_real_commands(tmp_path):
    study = read_toml(STUDY)
    root, steps, best = study["study"]["root"], study["step"], study["study"]["vars"]["select_best"]
    assert study["study"]["name"] == "recall" and set(study) == {"study", "step"}
    names = [s["name"] for s in steps]
    assert len(set(names)) == len(names) == 44 and all(re.fullmatch(r"[a-z0-9-]+", n) for n in names)
    grid = set()
    for i, step in enumerate(steps):
        assert set(step) <= {"name", "run", "about", "needs"} and set(step.get("needs", [])) <= set(names[:i])
        argv = [a.replace("{root}", root).replace("{select_best}", str(best)) for a in step["run"]]
        args = PARSERS[tuple(argv[:2])]().parse_args(argv[2:])  # a bad flag exits: SystemExit fails the test
        if argv[1] == "recall":
            grid.add((args.arch, args.width, args.chunk, args.select_chunks, args.select_only))
            chunk = f"-c{args.chunk}" if args.chunk != 4 else ""
            select = f"-select{args.select_chunks}" + ("-only" if args.select_only else "") if args.select_chunks else ""
            assert args.out == f"{root}/models/{args.arch}{chunk}{select}-{args.width}"
        else:
            assert step["needs"] == [names[names.index(step["name"].replace("cells-", "train-"))]]
    published = {(a, w, 4, 0, False) for a in ("eva", "full", "window", "mamba") for w in (64, 128, 256)}
    selection = {("eva", 128, 4, k, False) for k in (1, 2, 4)} | {("eva", w, 4, best, False) for w in (64, 256)}
    sweep = {("eva", 128, c, k, False) for c in (2, 8) for k in (0, best)} | {("eva", 128, 4, best, True)}
    assert grid == published | selection | sweep


def test_the_selection_steps_run_end_to_end_and_name_their_readings(tmp_path):
    """train-eva-selectbest-64 and its cells as the study names them, through the file's var, shortened by flags
    appended to their own lines (a tiny width: --width 32): the cells carry the selection model's name, so its
    rows never join EVA's, and EVA's ablations are read on it too."""
    steps = {s["name"]: s["run"] for s in read_toml(STUDY)["step"]}
    shorter = {"train": ["--steps", "2", "--width", "32"], "eval": ["--items", "2", "--long-items", "1", "--lengths", "64"]}
    for name in ("train-eva-selectbest-64", "cells-eva-selectbest-64"):
        argv = [a.replace("{root}", str(tmp_path)).replace("{select_best}", "3") for a in steps[name]]
        assert evalm([*argv, *shorter[argv[0]]]) == 0
    cells = sorted(p.name for p in (tmp_path / "cells" / "eva-select3-64").glob("eva-*.json"))
    readings = {name.split("-32-")[0] for name in cells}
    assert readings == {"eva-select3", "eva-select3-no-remote", "eva-select3-chunk-window"}
    assert json.loads((tmp_path / "models" / "eva-select3-64" / "model.json").read_text())["select_chunks"] == 3


def test_the_study_files_cheapest_steps_run_end_to_end_and_resume(tmp_path):
    """train-window-64 and cells-window-64 (window-only: the cheapest model), as the study names them,
    shortened by flags appended to their own lines (argparse: the last value wins)."""
    steps = {s["name"]: s["run"] for s in read_toml(STUDY)["step"]}
    shorter = {"train": ["--steps", "2"], "eval": ["--items", "2", "--long-items", "1", "--lengths", "64,256"]}
    for name in ("train-window-64", "cells-window-64", "train-window-64", "cells-window-64"):  # twice: resumed
        argv = [a.replace("{root}", str(tmp_path)) for a in steps[name]]
        assert evalm([*argv, *shorter[argv[0]]]) == 0
    cells = sorted(p.name for p in (tmp_path / "cells" / "window-64").glob("window-*.json"))
    assert cells == sorted(f"window-64-{t}.json" for t in ("kv-4", "kv-8", "kv-16", "passkey-64", "passkey-256",
                                                          "mqar_far-64", "mqar_far-256"))
