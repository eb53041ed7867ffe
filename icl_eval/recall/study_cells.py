"""`evalm eval recall-cells`: the recall study's test cells of one model `evalm train recall` trained,
one file per (reading, test, x), resumable by those files.

    evalm eval recall-cells --model runs/recall/models/eva-64 --out runs/recall/cells/eva-64

Tests (fresh seeds apart from training, accuracy beside chance, a bootstrap interval over items;
the data: text/recall_data.py):
- `kv`: MQAR at the training length per number of pairs (Zoology's Figure 2 axes: pairs x width);
- `passkey`: the copy task at each --lengths, past the training length (the passkey at a uniform
  random depth; exact match of all 4 tokens);
- `mqar_far`: 8 pairs at the start, random tokens, the 8 queries at the end, at each --lengths.
Long sequences are read through each model's own state (EVALM's cache in 2,048-token segments; the
Mamba twin's recurrent state: evalm/recall_models.py). Window-only attention (n·w key reads) and
Mamba (a fixed state) reach every length; full attention reads n²/2 keys and stops at
--full-max-length, EVA n²/(2c) chunk summaries and stops at --eva-max-length; each cell records its
seconds per item and the machine that read it.

EVA's component ablations (`--ablations`, evalm/tiling.py's `Ablation`) are read on the trained EVA
model itself, no retraining: `eva-no-remote` (the chunk summaries off: its window alone) and
`eva-chunk-window` (the window cut to the query's chunk: the summaries carry the rest), each on every
cell EVA reads.

A rerun skips the cells already written. OUT/settings.json holds the model's training settings, its
files by content (model.json and checkpoint.pt: an edited model is another model) and what makes a
cell (--items, --long-items, --long-from); a rerun with other ones is refused. Which
cells (--test-kv, --lengths, the max lengths, --ablations) and where (--device, --threads) are free.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import torch

from evalm.config_toolkit import ConfigError, InputError, Parser
from evalm.config_toolkit.device import check_threads
from evalm.eva import ablate
from evalm.icl_eval.cli_args import csv, load_flags
from evalm.icl_eval.recall.config import MAX_ITEMS
from evalm.icl_eval.stats.bootstrap import hierarchical_interval
from evalm.config_toolkit.machine import device_name, torch_threads
from evalm import eva_settings
from evalm.recall_models import ARCHS, CHECKPOINT, MODEL, StudyShape, load_trained, predict, reading_name
from evalm.storage import RunFolder
from evalm.storage.files import read_json, write_json
from evalm.text.recall_data import FAR_PAIRS, PASSKEY_TOKENS, UNLABELLED, Vocab, mqar, mqar_far, passkey

COMMAND = "evalm eval recall-cells"
TESTS = ("kv", "passkey", "mqar_far")
ABLATIONS = tuple(name for name in eva_settings.ABLATIONS if name != "none")
"""The ablations a cell may read: every one of EVA's but `none`."""
CELL_SETTINGS = ("items", "long_items", "long_from")
"""How a cell is computed (beside the model's settings): a rerun may not change them."""
MODEL_FILES = (MODEL, CHECKPOINT)
"""The files that are the model (its shape and weights), recorded by content with the cells' settings."""


@dataclass(frozen=True)
class CellsRun:
    """What one `evalm eval recall-cells` computes: its flags, typed once at the edge (`main`)."""

    model: str
    out: str
    test_kv: tuple[int, ...] = (4, 8, 16)
    lengths: tuple[int, ...] = (64, 256, 1024, 4096, 16384, 65536, 262144)
    full_max_length: int = 16384
    eva_max_length: int = 65536
    items: int = 64
    long_items: int = 4
    long_from: int = 4096
    ablations: tuple[str, ...] = ABLATIONS
    threads: int = 1
    device: str = "cpu"

    def __post_init__(self) -> None:
        for flag, values in (("items", (self.items,)), ("long_items", (self.long_items,))):
            if not 1 <= values[0] <= MAX_ITEMS:  # a billion items drew 484 GiB of arrays before the first score
                raise ConfigError(f"--{flag.replace('_', '-')} {values[0]}: from 1 to {MAX_ITEMS:,} test sequences")
        for flag in ("long_from", "full_max_length", "eva_max_length"):
            if getattr(self, flag) < 1:
                raise ConfigError(f"--{flag.replace('_', '-')} {getattr(self, flag)}: must be >= 1")
        if min(self.test_kv) < 1:
            raise ConfigError(f"--test-kv {','.join(map(str, self.test_kv))}: every number of pairs must be >= 1")
        bad = [n for n in self.lengths if not MIN_LENGTH <= n <= MAX_LENGTH]
        if bad:
            raise ConfigError(f"--lengths {bad[0]}: from {MIN_LENGTH} (far MQAR's {FAR_PAIRS} pairs at the start and "
                              f"again at the end, 4 tokens each pair) to {MAX_LENGTH:,} tokens")
        check_threads(self.threads)


MIN_LENGTH, MAX_LENGTH = 4 * FAR_PAIRS, 1 << 20
"""A test length's bounds: room for far MQAR's pairs twice (and a passkey copy); 4x the longest default length."""


def evaluate(model, test: str, x_value: int, settings: dict, run: CellsRun) -> dict:
    """One test cell: accuracy over the items with its interval, chance, seconds per item."""
    rng = np.random.default_rng([settings["seed"], 1_000_003, TESTS.index(test), x_value])
    n = run.items if test == "kv" or x_value <= run.long_from else run.long_items
    vocab = Vocab(settings["vocab"])
    if test == "kv":
        x, y = mqar(rng, n, settings["seq_len"], x_value, vocab)
    else:
        x, y = (passkey if test == "passkey" else mqar_far)(rng, n, x_value, vocab)
    scores, t0 = [], time.perf_counter()
    for i in range(n):
        labelled = np.nonzero(y[i] != UNLABELLED)[0]
        hit = predict(model, torch.from_numpy(x[i : i + 1]).to(run.device), labelled) == y[i, labelled]
        scores.append(float(hit.all()) if test == "passkey" else float(hit.mean()))
    lo, hi = hierarchical_interval([np.asarray(scores)], [list(range(n))])
    per_query = 1 / (vocab.values[1] - vocab.values[0])
    chance = per_query**PASSKEY_TOKENS if test == "passkey" else per_query
    return {"test": test, "x": x_value, "accuracy": float(np.mean(scores)), "ci95": [lo, hi], "items": n,
            "chance": chance, "context_guess": None if test == "passkey" else 1 / (x_value if test == "kv" else 8),
            "seconds_per_item": (time.perf_counter() - t0) / n, "device": device_name(run.device)}


def cells(arch: str, run: CellsRun) -> list[tuple[str, int]]:
    """The test cells of one model: pairs at the training length, then each length past it."""
    out = [("kv", kv) for kv in run.test_kv]
    reach = {"full": run.full_max_length, "eva": run.eva_max_length}.get(arch, max(run.lengths))
    for test in ("passkey", "mqar_far"):
        out += [(test, L) for L in run.lengths if L <= reach]
    return out


def _advice(keys: list[str]) -> str:
    if any(k.startswith("model_files") for k in keys):
        return "the model changed since these cells were read: restore it, or give the changed model another --out"
    return "use another --out, or the same model and flags"


def check_memory(run: CellsRun) -> None:
    """Refuse, before the model is built, cells this machine cannot hold (evalm.footprint's lower bound):
    the model twice (its weights and the checkpoint read into them), and at the largest cell its test
    sequences with their labels and what reading one leaves in the model's cache (full attention every
    key and value, EVA its window and one summary per chunk, the window its window, Mamba a fixed state).
    `--items 1e9` ended as a bug after drawing 484 GiB of arrays; a model.json claiming a huge width too."""
    from evalm.footprint import check_fits, parameters

    shape = read_json(Path(run.model) / MODEL) if (Path(run.model) / MODEL).is_file() else None
    if shape is None:
        return  # not a finished model: load_trained says so
    sizes = ("width", "vocab_size", "n_layer", "window", "chunk", "seq_len")
    bad = [k for k in sizes if not isinstance(shape.get(k), int) or isinstance(shape.get(k), bool) or shape[k] < 1]
    if bad or shape.get("arch") not in ARCHS:
        raise InputError(f"{Path(run.model) / MODEL}: {bad[0] if bad else 'arch'} {shape.get(bad[0] if bad else 'arch')!r} "
                         "is not a model of `evalm train recall`; train it again (or restore the file)")
    arch, width, layers = shape["arch"], shape["width"], shape["n_layer"]
    n = parameters(shape["vocab_size"], width, layers, 4 * width) + shape["seq_len"] * width
    kept = {"full": lambda L: L, "eva": lambda L: L // shape["chunk"] + shape["window"] + (L if shape.get("select_chunks") else 0),
            "window": lambda L: min(L, shape["window"]), "mamba": lambda L: 0}[arch]
    largest = 0
    for test, x_value in cells(arch, run):
        length = shape["seq_len"] if test == "kv" else x_value
        items = run.items if test == "kv" or x_value <= run.long_from else run.long_items
        largest = max(largest, 2 * 8 * items * (length + 1) + 2 * 4 * layers * kept(length) * width)
    check_fits(2 * 4 * n + largest, f"{run.model}: {arch}-{width} (about {n:.3g} parameters) read on --items "
               f"{run.items} / --long-items {run.long_items} test sequences up to {max(run.lengths):,} tokens",
               run.device)


def cell_name(reading: str, width: int, test: str, x_value: int) -> str:
    """A cell's file: `{reading}-{width}-{test}-{x}.json` (the reading: the arch, or eva-ABLATION)."""
    return f"{reading}-{width}-{test}-{x_value}.json"


def run_cells(run: CellsRun) -> int:
    """Every cell of the model `run.model` missing from `run.out`; how many were written."""
    check_memory(run)
    with torch_threads(run.threads):
        return _run_cells(run)


def _run_cells(run: CellsRun) -> int:
    model, settings, _ = load_trained(run.model, run.device)  # refused before the output folder is made
    if max(run.test_kv) * 4 > settings["seq_len"]:
        raise ConfigError(f"--test-kv {max(run.test_kv)}: pairs at most the training length / 4 = "
                          f"{settings['seq_len'] // 4} (Zoology's constraint)")
    if max(run.test_kv) >= settings["vocab"] // 2:
        raise ConfigError(f"--test-kv {max(run.test_kv)}: pairs at most the model's keys, --vocab / 2 - 1 = "
                          f"{settings['vocab'] // 2 - 1}")
    folder = RunFolder(run.out, COMMAND, inputs=[run.model])
    with folder.held():
        made = {k: v for k, v in settings.items() if k not in ("device", "threads")}
        # the model by content: an edited model.json (another window, say) loads the same weights into
        # another model, whose cells must not join the first one's
        files = dict(zip(MODEL_FILES, folder.identities([Path(run.model) / name for name in MODEL_FILES])))
        folder.record("settings.json", {**made, **{k: getattr(run, k) for k in CELL_SETTINGS}, "model_files": files},
                      added=("model_files",), what="holds cells of another model or made with other settings",
                      advice=_advice)
        arch, width = settings["arch"], settings["width"]
        base = reading_name(StudyShape(**read_json(Path(run.model) / MODEL)))
        readings = {base: "none", **({f"{base}-{a}": a for a in run.ablations} if arch == "eva" else {})}
        written = 0
        for reading, ablation in readings.items():
            wanted = [c for c in cells(arch, run) if not (folder.path / cell_name(reading, width, *c)).is_file()]
            if wanted and arch == "eva":
                ablate(model, ablation)  # the trained weights, one branch of the softmax switched
            for test, x_value in wanted:
                cell = {"arch": reading, "width": width, **evaluate(model, test, x_value, settings, run)}
                write_json(folder.path / cell_name(reading, width, test, x_value), cell, indent=None)
                written += 1
                print(f"{reading}-{width} {test} {x_value}: {cell['accuracy']:.3f} [{cell['ci95'][0]:.2f}, "
                      f"{cell['ci95'][1]:.2f}] ({cell['seconds_per_item']:.1f} s/item)", flush=True)
    return written


def parser() -> Parser:
    p = Parser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a model folder of `evalm train recall` (required)")
    p.add_argument("--out", required=True, help="the cells' folder (one JSON file per cell) (required)")
    p.add_argument("--test-kv", type=csv(int), default=(4, 8, 16), help="MQAR pairs tested (default: 4,8,16)")
    p.add_argument("--lengths", type=csv(int), default=(64, 256, 1024, 4096, 16384, 65536, 262144),
                   help="test lengths of passkey and far MQAR (default: 64,256,1024,4096,16384,65536,262144)")
    p.add_argument("--full-max-length", type=int, default=16384, help="full attention's longest test (default: 16384)")
    p.add_argument("--eva-max-length", type=int, default=65536, help="EVA's longest test: its summaries grow with the "
                   "length, n²/c pairs in all (default: 65536)")
    p.add_argument("--items", type=int, default=64, help="test sequences per cell (default: 64)")
    p.add_argument("--long-items", type=int, default=4, help="test sequences per cell past --long-from (default: 4)")
    p.add_argument("--long-from", type=int, default=4096, help="length past which --long-items apply (default: 4096)")
    p.add_argument("--ablations", type=_names, default=ABLATIONS,
                   help="EVA's ablations read on the trained EVA model, '' for none (default: no-remote,chunk-window)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    load_flags(p, CellsRun, ("device",))  # the evaluator's one --device (recorded per cell)
    return p


def _names(text: str) -> tuple[str, ...]:
    names = tuple(a for a in text.split(",") if a)
    if any(a not in ABLATIONS for a in names):
        raise ValueError(f"{text!r}: ablations from {', '.join(ABLATIONS)}")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    run = CellsRun(**{f.name: getattr(args, f.name) for f in fields(CellsRun) if getattr(args, f.name) is not None})
    written = run_cells(run)
    print(f"{run.out}: {written} cells written")
    return 0
