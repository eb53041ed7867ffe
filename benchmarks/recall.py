"""Zoology's recall protocol at CPU scale: EVA, full attention, window-only attention and Mamba,
trained from scratch on the same data, steps and width (Arora et al. 2023, "Zoology").

    pip install 'evalm[hf]'                              # transformers: the Mamba twin (benchmarks/recall_ssm.py)
    python benchmarks/recall.py --out runs/recall        # the grid: hours on 2 cores, resumable (rerun it)
    python benchmarks/recall.py --out runs/recall --tables          # its markdown tables (docs/results.md)
    python benchmarks/recall.py --out runs/recall --chunk-mates     # where EVA's MQAR errors go
    python benchmarks/recall.py --widths 64 --archs eva,window --steps 20 --items 4 --lengths 128,512 --out runs/recall-small

Every model of a width has the same data (one seeded stream, identical batches), steps, optimiser
and schedule. Training mixes two tasks in every batch, half each:
- MQAR, Zoology's multi-query associative recall (`zoology/data/multiquery_ar.py`): `kv` key-value
  pairs (keys from one half of the vocabulary, values from the other), then the keys again at
  power-law gaps (power_a = 0.01) among random tokens, each to be answered with its value; `kv`
  drawn per sequence from --train-kv;
- a passkey copy: random tokens, PASS and a 4-token passkey at a random position, then ASK, after
  which the passkey is to be repeated.
Tests (fresh seeds, accuracy beside chance, a bootstrap interval over items):
- `kv`: MQAR at the training length per number of pairs (Zoology's Figure 2 axes: pairs x width);
- `passkey`: the copy task at each --lengths, past the training length (the passkey at a uniform
  random depth; exact match of all 4 tokens);
- `mqar_far`: 8 pairs at the start, random tokens, the 8 queries at the end, at each --lengths.
Long sequences are read through each model's own state (EVALM's cache in 2,048-token segments; the
Mamba twin's recurrent state). Window-only attention (n·w key reads) and Mamba (a fixed state) reach
262,144 tokens; full attention reads n²/2 keys and stops at --full-max-length, EVA n²/(2c) chunk
summaries (c = 4 here: an eighth of full attention's reads at any length) and stops at
--eva-max-length; each cell records its seconds per item.

EVA's component ablations (`--ablations`, evalm/tiling.py's `Ablation`) are read on the trained EVA
model itself, no retraining: `eva-no-remote` (the chunk summaries off: its window alone) and
`eva-chunk-window` (the window cut to the query's chunk: the summaries carry the rest), each on every
cell EVA reads. Beside `window` (trained without summaries) they say whether EVA's summaries carry
what it retrieves past its window (arXiv 2510.05901's question for window + linear hybrids).

Resumable: a model's training checkpoints every --checkpoint-every steps (`OUT/models/`, loaded with
weights_only=True), each test cell is one file in `OUT/cells/`; a rerun skips what is there. The
settings are `OUT/settings.json`; a rerun with other ones is refused (--archs, --widths, --ablations
--threads and --device aside: processes on different archs may share one --out, e.g. `--archs mamba`
beside `--archs eva,full,window` on a second core).

`--device cuda` trains and reads on a GPU: the same data stream and the same initial weights (made on
the CPU, then moved), so a model trained there is the CPU's model up to floating-point order; each model
records the machine its steps ran on and each cell the machine that read it (the tables' device column).
Mamba's scan is then launch-bound (one kernel a time step), without `mamba-ssm`'s fused kernels.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))  # recall_ssm beside this file

from evalm import EvalmModel, ModelConfig  # noqa: E402
from evalm.eva import ablate  # noqa: E402
from evalm.icl_eval.stats.bootstrap import hierarchical_interval  # noqa: E402

PASSKEY_TOKENS = 4
ARCHS = ("eva", "full", "window", "mamba")
SEGMENT = 2048


class Vocab:
    """Zoology's two halves: keys 1 .. v/2 - 1, values v/2 .. v - 1; then PASS = v and ASK = v + 1 (0 unused)."""

    def __init__(self, v: int):
        self.keys, self.values, self.pass_token, self.ask_token, self.size = (1, v // 2), (v // 2, v), v, v + 1, v + 2


def mqar(rng: np.random.Generator, n: int, seq_len: int, kv: int, vocab: Vocab, power_a: float = 0.01):
    """Zoology's multiquery_ar with random non-queries: inputs and labels (n, seq_len), -100 unlabelled."""
    inputs, labels = np.zeros((n, seq_len + 1), np.int64), np.full((n, seq_len + 1), -100, np.int64)
    space = (seq_len - 2 * kv) // 2
    p = power_a * np.arange(1, space + 1) ** (power_a - 1)
    p /= p.sum()
    for i in range(n):
        keys = rng.choice(np.arange(*vocab.keys), kv, replace=False)
        values = rng.choice(np.arange(*vocab.values), kv, replace=False)
        gaps = rng.choice(space, kv, replace=False, p=p)
        inputs[i, 0 : 2 * kv : 2], inputs[i, 1 : 2 * kv : 2] = keys, values
        inputs[i, 2 * kv + 2 * gaps] = keys
        labels[i, 2 * kv + 2 * gaps + 1] = values
    filler = rng.integers(1, vocab.values[1], inputs.shape)
    inputs = np.where(inputs == 0, filler, inputs)
    return inputs[:, :-1], labels[:, 1:]


def passkey(rng: np.random.Generator, n: int, seq_len: int, vocab: Vocab):
    """Random tokens, PASS + passkey at a uniform position, ASK + passkey at the end; labels on the repeat."""
    k = PASSKEY_TOKENS
    inputs = rng.integers(1, vocab.values[1], (n, seq_len + 1))
    labels = np.full((n, seq_len + 1), -100, np.int64)
    for i in range(n):
        key = rng.integers(*vocab.values, k)
        at = int(rng.integers(0, seq_len - 2 * k - 2))
        inputs[i, at], inputs[i, at + 1 : at + 1 + k] = vocab.pass_token, key
        inputs[i, seq_len - k], inputs[i, seq_len - k + 1 :] = vocab.ask_token, key
        labels[i, seq_len - k + 1 :] = key
    return inputs[:, :-1], labels[:, 1:]


def mqar_far(rng: np.random.Generator, n: int, seq_len: int, vocab: Vocab, kv: int = 8):
    """kv pairs at the start, random tokens, every key queried at the end (teacher-forced, Zoology's labels)."""
    inputs = rng.integers(1, vocab.values[1], (n, seq_len + 1))
    labels = np.full((n, seq_len + 1), -100, np.int64)
    for i in range(n):
        keys = rng.choice(np.arange(*vocab.keys), kv, replace=False)
        values = rng.choice(np.arange(*vocab.values), kv, replace=False)
        inputs[i, 0 : 2 * kv : 2], inputs[i, 1 : 2 * kv : 2] = keys, values
        order = rng.permutation(kv)
        tail = seq_len + 1 - 2 * kv
        inputs[i, tail::2], inputs[i, tail + 1 :: 2] = keys[order], values[order]
        labels[i, tail + 1 :: 2] = values[order]
    return inputs[:, :-1], labels[:, 1:]


def training_batch(rng: np.random.Generator, args) -> tuple[torch.Tensor, torch.Tensor]:
    """--mqar-share of the batch MQAR (kv drawn per sequence from --train-kv), the rest passkey copy."""
    vocab, n_mqar = Vocab(args.vocab), round(args.batch_size * args.mqar_share)
    parts = [mqar(rng, 1, args.seq_len, int(rng.choice(args.train_kv)), vocab) for _ in range(n_mqar)]
    parts.append(passkey(rng, args.batch_size - n_mqar, args.seq_len, vocab))
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    return torch.from_numpy(x), torch.from_numpy(y)


def build(arch: str, width: int, args) -> torch.nn.Module:
    """The model of one arch: 2 attention blocks (MLP 4x), or 4 Mamba blocks (no MLP: about as many
    parameters), width `width`, circular positions of period = the training length."""
    torch.manual_seed(args.seed)
    if arch == "mamba":
        from recall_ssm import MambaTwin

        return MambaTwin(Vocab(args.vocab).size, width, 2 * args.n_layer).to(args.device)
    config = ModelConfig(vocab_size=Vocab(args.vocab).size, d_model=width, n_layer=args.n_layer, n_head=max(1, width // 32),
                         d_ff=4 * width, window_size=args.window, chunk_size=args.chunk, attention=arch,
                         circular_period=args.seq_len, dropout=0.0, attn_dropout=0.0, init_std=0.02)
    model = EvalmModel(config)
    model.init_weights()  # on the CPU, then moved: the same initial weights on any --device
    return model.to(args.device)


def device_name(device: str) -> str:
    """What ran a model or a cell: the GPU's name, or the CPU's model name (docs/results.md names each figure's machine)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(device)
    names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
             if line.startswith("model name")] if Path("/proc/cpuinfo").is_file() else []
    return names[0] if names else device


def logits_of(model, x: torch.Tensor) -> torch.Tensor:
    return model(x)[0] if not isinstance(model, EvalmModel) else model(x)


def lr_at(step: int, args) -> float:
    """Linear warm-up then cosine decay to 10% (a pure function of the step)."""
    warm = max(1, args.steps // 20)
    if step < warm:
        return args.lr * (step + 1) / warm
    return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * (step - warm) / max(1, args.steps - warm))))


def train(arch: str, width: int, args, out: Path) -> tuple[torch.nn.Module, dict]:
    """Train (or resume, or load) one model; its log: parameters, seconds per step, the last losses."""
    path = out / "models" / f"{arch}-{width}.pt"
    model = build(arch, width, args)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.98))
    state = (torch.load(path, weights_only=True, map_location=args.device) if path.is_file()
             else {"step": 0, "log": {"seconds": 0.0, "loss": []}})
    if "model" in state:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
    log, rng = state["log"], np.random.default_rng([args.seed, width])
    for _ in range(state["step"]):  # the data stream is a pure function of (seed, width, step)
        training_batch(rng, args)
    model.train()
    if state["step"] < args.steps:  # where the steps ran (a run resumed elsewhere names both machines)
        here = device_name(args.device)
        log["device"] = here if log.get("device", here) == here else f"{log['device']}, then {here}"
    t0 = time.perf_counter() - log["seconds"]
    for step in range(state["step"], args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        x, y = (t.to(args.device) for t in training_batch(rng, args))
        loss = F.cross_entropy(logits_of(model, x).flatten(0, 1).float(), y.flatten(), ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        log["loss"] = (log["loss"] + [round(loss.item(), 4)])[-50:]
        done = step + 1
        if done % args.checkpoint_every == 0 or done == args.steps:
            log["seconds"] = time.perf_counter() - t0
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"step": done, "model": model.state_dict(), "opt": opt.state_dict(), "log": log}, path)
            print(f"{arch}-{width} step {done}/{args.steps} loss {np.mean(log['loss'][-10:]):.3f} "
                  f"({log['seconds'] / done:.2f} s/step)", flush=True)
    log = {**log, "params": sum(p.numel() for p in model.parameters()), "steps": args.steps,
           "seconds_per_step": log["seconds"] / max(1, args.steps), "device": log.get("device", "not recorded")}
    return model.eval(), log


@torch.no_grad()
def predict(model, x: torch.Tensor, labelled: np.ndarray) -> np.ndarray:
    """Greedy predictions at the labelled positions of one sequence x (1, L), read in segments through
    the model's own state (EVALM's cache; the Mamba twin's recurrent state)."""
    preds, cache, state = [], (model.new_cache() if isinstance(model, EvalmModel) else None), None
    for lo in range(0, x.shape[1], SEGMENT):
        seg = x[:, lo : lo + SEGMENT]
        if cache is not None:
            logits = model(seg, cache=cache)
        else:
            logits, state = model(seg, state)
        want = labelled[(labelled >= lo) & (labelled < lo + seg.shape[1])] - lo
        preds.append(logits[0, want].argmax(-1).cpu().numpy())
    return np.concatenate(preds)


def evaluate(model, test: str, x_value: int, args) -> dict:
    """One test cell: accuracy over --items sequences with its interval, chance, seconds per item."""
    rng = np.random.default_rng([args.seed, 1_000_003, ARGS_TESTS.index(test), x_value])
    n = args.items if test == "kv" or x_value <= args.long_from else args.long_items
    vocab = Vocab(args.vocab)
    if test == "kv":
        x, y = mqar(rng, n, args.seq_len, x_value, vocab)
    else:
        x, y = (passkey if test == "passkey" else mqar_far)(rng, n, x_value, vocab)
    scores, t0 = [], time.perf_counter()
    for i in range(n):
        labelled = np.nonzero(y[i] != -100)[0]
        hit = predict(model, torch.from_numpy(x[i : i + 1]).to(args.device), labelled) == y[i, labelled]
        scores.append(float(hit.all()) if test == "passkey" else float(hit.mean()))
    lo, hi = hierarchical_interval([np.asarray(scores)], [list(range(n))])
    per_query = 1 / (vocab.values[1] - vocab.values[0])
    chance = per_query**PASSKEY_TOKENS if test == "passkey" else per_query
    return {"test": test, "x": x_value, "accuracy": float(np.mean(scores)), "ci95": [lo, hi], "items": n,
            "chance": chance, "context_guess": None if test == "passkey" else 1 / (x_value if test == "kv" else 8),
            "seconds_per_item": (time.perf_counter() - t0) / n, "device": device_name(args.device)}


ARGS_TESTS = ("kv", "passkey", "mqar_far")


def cells(arch: str, width: int, args) -> list[tuple[str, int]]:
    """The test cells of one model: pairs at the training length, then each length past it."""
    out = [("kv", kv) for kv in args.test_kv]
    reach = {"full": args.full_max_length, "eva": args.eva_max_length}.get(arch, max(args.lengths))
    for test in ("passkey", "mqar_far"):
        out += [(test, L) for L in args.lengths if L <= reach]
    return out


def run_grid(args) -> None:
    out = Path(args.out)
    settings = {k: v for k, v in vars(args).items()
                if k not in ("out", "tables", "chunk_mates", "archs", "widths", "threads", "ablations", "device")}
    # (which models a process trains, and on which device, is not how any is trained: two processes may share
    # --out on other archs; the device is recorded per model and per cell)
    saved = out / "settings.json"
    if saved.is_file() and json.loads(saved.read_text()) != json.loads(json.dumps(settings)):
        raise SystemExit(f"{out}: computed with other settings ({saved}); use another --out or the same flags")
    out.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(settings, indent=1))
    torch.set_num_threads(args.threads)
    order = [(a, w) for w in args.widths for a in sorted(args.archs, key=lambda a: a == "mamba")]  # a width whole,
    # Mamba last in it: its step costs ~5x an attention step here (benchmarks/recall_ssm.py)
    for arch, width in order:
        readings = {arch: "none", **({f"eva-{a}": a for a in args.ablations} if arch == "eva" else {})}
        todo = {name: [c for c in cells(arch, width, args) if not _cell_path(out, name, width, *c).is_file()]
                for name in readings}
        if not any(todo.values()):
            continue
        model, log = train(arch, width, args, out)
        (out / "models" / f"{arch}-{width}.json").write_text(json.dumps(log, indent=1))
        for name, wanted in todo.items():
            if arch == "eva":
                ablate(model, readings[name])  # the trained weights, one branch of the softmax switched
            for test, x_value in wanted:
                cell = {"arch": name, "width": width, **evaluate(model, test, x_value, args)}
                _cell_path(out, name, width, test, x_value).write_text(json.dumps(cell))
                print(f"{name}-{width} {test} {x_value}: {cell['accuracy']:.3f} [{cell['ci95'][0]:.2f}, "
                      f"{cell['ci95'][1]:.2f}] ({cell['seconds_per_item']:.1f} s/item)", flush=True)


def _cell_path(out: Path, arch: str, width: int, test: str, x_value: int) -> Path:
    path = out / "cells" / f"{arch}-{width}-{test}-{x_value}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _rank(arch: str) -> tuple[int, str]:
    """Table order: ARCHS, each EVA ablation after EVA."""
    return ARCHS.index(arch.split("-")[0]), arch


def tables(out: Path) -> str:
    """Markdown: accuracy vs pairs per width, passkey and far MQAR vs length, and the CPU cost."""
    found = [json.loads(p.read_text()) for p in sorted((out / "cells").glob("*.json"))]
    if not found:
        raise SystemExit(f"{out}/cells: no results yet; run the grid first")
    lines = []
    for test, axis in (("kv", "key-value pairs (training length)"), ("passkey", "tokens"), ("mqar_far", "tokens")):
        rows = [c for c in found if c["test"] == test]
        xs = sorted({c["x"] for c in rows})
        lines += [f"\n**{test}**: accuracy [95% interval] by {axis}", "",
                  "| model | width | " + " | ".join(f"{x:,}" for x in xs) + " |", "|---|---|" + "---|" * len(xs)]
        for arch, width in sorted({(c["arch"], c["width"]) for c in rows}, key=lambda a: (a[1], _rank(a[0]))):
            by_x = {c["x"]: c for c in rows if (c["arch"], c["width"]) == (arch, width)}
            lines.append(f"| {arch} | {width} | " + " | ".join(
                f"{by_x[x]['accuracy']:.2f} [{by_x[x]['ci95'][0]:.2f}, {by_x[x]['ci95'][1]:.2f}]" if x in by_x else "-"
                for x in xs) + " |")
        chance = {c["x"]: c["chance"] for c in rows}
        lines.append("| chance | | " + " | ".join(f"{chance[x]:.2g}" for x in xs) + " |")
    lines += ["", "| model | width | parameters | device | train s/step | eval s/item at each length |",
              "|---|---|---|---|---|---|"]
    for arch, width in sorted((p.stem.rsplit("-", 1) for p in (out / "models").glob("*.json")),
                              key=lambda m: (int(m[1]), _rank(m[0]))):
        log = json.loads((out / "models" / f"{arch}-{width}.json").read_text())
        per = {c["x"]: c["seconds_per_item"] for c in found if (c["arch"], str(c["width"])) == (arch, width)
               and c["test"] == "passkey"}
        lines.append(f"| {arch} | {width} | {log['params']:,} | {log.get('device', 'not recorded')} | "
                     f"{log['seconds_per_step']:.2f} | "
                     + ", ".join(f"{x:,}: {s:.1f}" for x, s in sorted(per.items())) + " |")
    return "\n".join(lines)


def chunk_mates(out: Path, kv: int = 16, n: int = 64, device: str = "cpu") -> str:
    """Where a trained EVA model's MQAR errors go: MQAR at the training length with `kv` pairs, n sequences
    (seeded apart from the test cells); per EVA model of --out, the accuracy and how many wrong answers are
    the value of a pair sharing the queried pair's chunk. A pair is 2 tokens and a chunk c, so the pairs
    laid out from position 0 share each chunk c / 2 at a time; each past chunk is one pseudo-token to EVA,
    one key and one value whose weights within the chunk do not depend on the query (docs/eva.md, "The
    closed form"), so a model that reads the pair through that summary alone can tell the chunk, not the
    pair. Beside it, what errors uniform over the other in-context values would give."""
    args = argparse.Namespace(**json.loads((out / "settings.json").read_text()), device=device)
    vocab, per_chunk = Vocab(args.vocab), max(1, args.chunk // 2)
    lines = [f"| model | MQAR, {kv} pairs | wrong answers = a chunk-mate's value | if wrong answers were uniform |",
             "|---|---|---|---|"]
    for path in sorted((out / "models").glob("eva-*.pt"), key=lambda p: int(p.stem.split("-")[1])):
        width = int(path.stem.split("-")[1])
        model = build("eva", width, args)
        model.load_state_dict(torch.load(path, weights_only=True, map_location=args.device)["model"])
        model.eval()
        x, y = mqar(np.random.default_rng([args.seed, 2_000_003, kv]), n, args.seq_len, kv, vocab)
        right = wrong = mate = 0
        for i in range(n):
            labelled = np.nonzero(y[i] != -100)[0]
            keys, values = x[i, 0 : 2 * kv : 2], x[i, 1 : 2 * kv : 2]
            guesses = predict(model, torch.from_numpy(x[i : i + 1]).to(args.device), labelled)
            for guess, query in zip(guesses, x[i, labelled]):  # y is x shifted: the key sits where its answer is due
                j = int(np.nonzero(keys == query)[0][0])
                if guess == values[j]:
                    right += 1
                    continue
                wrong += 1
                mates = [m for m in range(kv) if m // per_chunk == j // per_chunk and m != j]
                mate += int(guess in values[mates])
        others = (per_chunk - 1) / (kv - 1)
        lines.append(f"| eva-{width} | {right / (right + wrong):.2f} | {mate}/{wrong} | {others:.2f} of them |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ints = lambda text: [int(v) for v in text.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/recall", help="output folder (default: runs/recall)")
    p.add_argument("--tables", action="store_true", help="print the markdown tables of --out and stop")
    p.add_argument("--chunk-mates", action="store_true",
                   help="print where the trained EVA models' MQAR errors go (chunk_mates) and stop")
    p.add_argument("--archs", type=lambda t: t.split(","), default=list(ARCHS), help="default: eva,full,window,mamba")
    p.add_argument("--widths", type=ints, default=[64, 128, 256], help="d_model (default: 64,128,256)")
    p.add_argument("--n-layer", type=int, default=2, help="attention blocks; Mamba gets twice as many (default: 2)")
    p.add_argument("--seq-len", type=int, default=64, help="training length (default: 64)")
    p.add_argument("--window", type=int, default=16, help="EVA's and window-only's block w (default: 16)")
    p.add_argument("--chunk", type=int, default=4, help="EVA's chunk c (default: 4)")
    p.add_argument("--vocab", type=int, default=128, help="keys and values, half each (Zoology's vocab_size; default: 128)")
    p.add_argument("--mqar-share", type=float, default=0.75, help="share of each batch that is MQAR (default: 0.75)")
    p.add_argument("--train-kv", type=ints, default=[4, 8, 16], help="MQAR pairs in training (default: 4,8,16)")
    p.add_argument("--steps", type=int, default=2500, help="optimizer steps (default: 2500)")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per step (default: 32)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default: 3e-3)")
    p.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints (default: 100)")
    p.add_argument("--test-kv", type=ints, default=[4, 8, 16], help="MQAR pairs tested (default: 4,8,16)")
    p.add_argument("--lengths", type=ints, default=[64, 256, 1024, 4096, 16384, 65536, 262144],
                   help="test lengths of passkey and far MQAR (default: 64,256,1024,4096,16384,65536,262144)")
    p.add_argument("--full-max-length", type=int, default=16384, help="full attention's longest test (default: 16384)")
    p.add_argument("--eva-max-length", type=int, default=65536, help="EVA's longest test: its summaries grow with the "
                   "length, n²/c pairs in all (default: 65536)")
    p.add_argument("--items", type=int, default=64, help="test sequences per cell (default: 64)")
    p.add_argument("--long-items", type=int, default=4, help="test sequences per cell past --long-from (default: 4)")
    p.add_argument("--long-from", type=int, default=4096, help="length past which --long-items apply (default: 4096)")
    p.add_argument("--seed", type=int, default=0, help="model init and data seed (default: 0)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    p.add_argument("--device", default="cpu", help="torch device of training and tests, e.g. cuda; recorded per model "
                   "and per cell, not a setting: the data and initial weights are the same on any (default: cpu)")
    p.add_argument("--ablations", type=lambda t: [a for a in t.split(",") if a], default=["no-remote", "chunk-window"],
                   help="EVA's ablations read on the trained EVA model, '' for none (default: no-remote,chunk-window)")
    args = p.parse_args(argv)
    if args.tables:
        print(tables(Path(args.out)))
        return
    if args.chunk_mates:
        print(chunk_mates(Path(args.out), device=args.device))
        return
    bad = [a for a in args.archs if a not in ARCHS] + [a for a in args.ablations if a not in ("no-remote", "chunk-window")]
    if bad or max(args.train_kv + args.test_kv) * 4 > args.seq_len:
        raise SystemExit(f"--archs from {ARCHS}, --ablations from no-remote, chunk-window; pairs at most --seq-len / 4 "
                         "(Zoology's constraint)")
    run_grid(args)


if __name__ == "__main__":
    main()
