"""`evalm eval recall-tables`: the recall study's tables (icl_eval/tables.py `recall_study`, the one writer of study
tables), or where EVA's MQAR errors go, read from a study folder (Zoology's recall protocol at CPU scale: EVA, full
attention, window-only attention and Mamba trained alike).

    evalm run --config configs/study-recall.toml                   # the grid (hours on 2 cores; rerun to resume)
    evalm eval recall-tables --root runs/recall                     # its markdown tables (docs/results.md)
    evalm eval recall-tables --root runs/recall --chunk-mates       # where EVA's MQAR errors go

The study's steps write what is read here: `evalm train recall` trains one (arch, width) into
ROOT/models/ARCH-WIDTH and `evalm eval recall-cells` writes its test cells (study_cells.py) into
ROOT/cells/ARCH-WIDTH, one file per cell. The tables read those files; the chunk-mates reading loads the
trained EVA models and scores fresh MQAR sequences (seeded apart from the cells).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from evalm.config_toolkit.markdown import markdown
from evalm.icl_eval.tables import recall_study
from evalm.recall_models import LOG, MODEL, StudyShape, load_trained, predict, reading_name
from evalm.text.recall_data import Vocab, mqar


def _mates_of(model, settings: dict, kv: int, n: int, device: str) -> tuple[int, int, int]:
    """(right, wrong, wrong answers that are a chunk-mate's value) over n MQAR sequences of kv pairs."""
    vocab, per_chunk = Vocab(settings["vocab"]), max(1, settings["chunk"] // 2)
    x, y = mqar(np.random.default_rng([settings["seed"], 2_000_003, kv]), n, settings["seq_len"], kv, vocab)
    right = wrong = mate = 0
    for i in range(n):
        labelled = np.nonzero(y[i] != -100)[0]
        keys, values = x[i, 0 : 2 * kv : 2], x[i, 1 : 2 * kv : 2]
        guesses = predict(model, torch.from_numpy(x[i : i + 1]).to(device), labelled)
        for guess, query in zip(guesses, x[i, labelled]):  # y is x shifted: the key sits where its answer is due
            j = int(np.nonzero(keys == query)[0][0])
            if guess == values[j]:
                right += 1
                continue
            wrong += 1
            mates = [m for m in range(kv) if m // per_chunk == j // per_chunk and m != j]
            mate += int(guess in values[mates])
    return right, wrong, mate


def chunk_mates(out: Path, kv: int = 16, n: int = 64, device: str = "cpu") -> str:
    """Where a trained EVA model's MQAR errors go: MQAR at the training length with `kv` pairs, n sequences
    (seeded apart from the test cells); per EVA model of OUT/models, the accuracy and how many wrong answers
    are the value of a pair sharing the queried pair's chunk. A pair is 2 tokens and a chunk c, so the pairs
    laid out from position 0 share each chunk c / 2 at a time; each past chunk is one pseudo-token to EVA,
    one key and one value whose weights within the chunk do not depend on the query (docs/eva.md, "The
    closed form"), so a model that reads the pair through that summary alone can tell the chunk, not the
    pair. Beside it, what errors uniform over the other in-context values would give."""
    found, rows = [], []
    for folder in (out / "models").glob("eva*"):
        if (folder / LOG).is_file():
            model, settings, _ = load_trained(folder, device)
            found.append((settings["width"], reading_name(StudyShape(**json.loads((folder / MODEL).read_text()))),
                          model, settings))
    for width, name, model, settings in sorted(found, key=lambda f: f[:2]):
        right, wrong, mate = _mates_of(model, settings, kv, n, device)
        others = (max(1, settings["chunk"] // 2) - 1) / (kv - 1)
        rows.append([f"{name}-{width}", f"{right / (right + wrong):.2f}", f"{mate}/{wrong}", f"{others:.2f} of them"])
    return markdown(["model", f"MQAR, {kv} pairs", "wrong answers = a chunk-mate's value", "if wrong answers were uniform"],
                    rows)


def main(argv: Sequence[str] | None = None) -> int:
    from evalm.config_toolkit import Parser

    p = Parser(prog="evalm eval recall-tables", description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default="runs/recall", help="the study's folder, its [study] root (default: runs/recall)")
    p.add_argument("--chunk-mates", action="store_true",
                   help="print where the trained EVA models' MQAR errors go instead of the tables (default: off)")
    args = p.parse_args(argv)
    print(chunk_mates(Path(args.root)) if args.chunk_mates else recall_study(Path(args.root)))
    return 0
