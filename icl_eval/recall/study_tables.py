"""The recall study's tables, and where EVA's MQAR errors go, read from a study folder (Zoology's recall
protocol at CPU scale: EVA, full attention, window-only attention and Mamba trained alike).

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

from evalm.config_toolkit import MissingInput
from evalm.recall_models import ARCHS, LOG, MODEL, StudyShape, load_trained, predict, reading_name
from evalm.text.recall_data import Vocab, mqar


def _rank(arch: str) -> tuple[int, str]:
    """Table order: ARCHS, each EVA ablation after EVA."""
    return ARCHS.index(arch.split("-")[0]), arch


def _cells(out: Path) -> list[dict]:
    """Every cell file under OUT/cells (each model's folder; its settings.json and markers aside)."""
    found = [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*/*.json"))
             if p.name != "settings.json" and not p.name.startswith(".")]
    if not found:
        raise MissingInput(f"{out}/cells: no results yet; run the study first (evalm run --config "
                           "configs/study-recall.toml)")
    return found


def _accuracy_table(found: list[dict], test: str, axis: str) -> list[str]:
    """Accuracy [95% interval] per model and width by x, and chance."""
    rows = [c for c in found if c["test"] == test]
    xs = sorted({c["x"] for c in rows})
    lines = [f"\n**{test}**: accuracy [95% interval] by {axis}", "",
             "| model | width | " + " | ".join(f"{x:,}" for x in xs) + " |", "|---|---|" + "---|" * len(xs)]
    for arch, width in sorted({(c["arch"], c["width"]) for c in rows}, key=lambda a: (a[1], _rank(a[0]))):
        by_x = {c["x"]: c for c in rows if (c["arch"], c["width"]) == (arch, width)}
        lines.append(f"| {arch} | {width} | " + " | ".join(
            f"{by_x[x]['accuracy']:.2f} [{by_x[x]['ci95'][0]:.2f}, {by_x[x]['ci95'][1]:.2f}]" if x in by_x else "-"
            for x in xs) + " |")
    chance = {c["x"]: c["chance"] for c in rows}
    lines.append("| chance | | " + " | ".join(f"{chance[x]:.2g}" for x in xs) + " |")
    return lines


def tables(out: Path) -> str:
    """Markdown: accuracy vs pairs per width, passkey and far MQAR vs length, and the cost of each model."""
    found = _cells(out)
    lines = []
    for test, axis in (("kv", "key-value pairs (training length)"), ("passkey", "tokens"), ("mqar_far", "tokens")):
        lines += _accuracy_table(found, test, axis)
    lines += ["", "| model | width | parameters | device | train s/step | eval s/item at each length |",
              "|---|---|---|---|---|---|"]
    models = []
    for folder in (out / "models").glob("*"):
        if (folder / LOG).is_file():
            shape = json.loads((folder / MODEL).read_text())
            models.append((shape["arch"], shape["width"], json.loads((folder / LOG).read_text())))
    for arch, width, log in sorted(models, key=lambda m: (m[1], _rank(m[0]))):
        per = {c["x"]: c["seconds_per_item"] for c in found
               if (c["arch"], c["width"]) == (arch, width) and c["test"] == "passkey"}
        lines.append(f"| {arch} | {width} | {log['params']:,} | {log.get('device', 'not recorded')} | "
                     f"{log['seconds_per_step']:.2f} | "
                     + ", ".join(f"{x:,}: {s:.1f}" for x, s in sorted(per.items())) + " |")
    return "\n".join(lines)


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
    lines = [f"| model | MQAR, {kv} pairs | wrong answers = a chunk-mate's value | if wrong answers were uniform |",
             "|---|---|---|---|"]
    found = []
    for folder in (out / "models").glob("eva*"):
        if (folder / LOG).is_file():
            model, settings, _ = load_trained(folder, device)
            found.append((settings["width"], reading_name(StudyShape(**json.loads((folder / MODEL).read_text()))),
                          model, settings))
    for width, name, model, settings in sorted(found, key=lambda f: f[:2]):
        right, wrong, mate = _mates_of(model, settings, kv, n, device)
        others = (max(1, settings["chunk"] // 2) - 1) / (kv - 1)
        lines.append(f"| {name}-{width} | {right / (right + wrong):.2f} | {mate}/{wrong} | {others:.2f} of them |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from evalm.config_toolkit import Parser

    p = Parser(prog="evalm eval recall-tables", description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default="runs/recall", help="the study's folder, its [study] root (default: runs/recall)")
    p.add_argument("--chunk-mates", action="store_true",
                   help="print where the trained EVA models' MQAR errors go instead of the tables (default: off)")
    args = p.parse_args(argv)
    print(chunk_mates(Path(args.root)) if args.chunk_mates else tables(Path(args.root)))
    return 0
