"""The attention-sink test: a transformers model's own weights under EVA's window written as a mask.

    evalm eval sink --hf-model runs/convert/smollm2-hf --book data/samples/books/paradise_lost.txt \
                    --max-tokens 4096 --window 1024 --sinks 0,1,4,16 --out runs/convert/ppl/sink-4096

Exact softmax attention where a query reads only EVA's local keys (evalm/tiling.py: block or overlap
geometry, window_start(i) = max(0, ⌊i/w⌋·w − ext)) plus the first `sink` positions, and no summaries. Sink 0
is the model's conversion read with `--eva-ablation no-remote` (the same weights, RoPE at i, the same keys:
tests/icl_eval/test_sink.py holds them equal); a sink that restores the block starts isolates position 0's
role. One forward per row over the whole sequence: the mask and each layer's attention weights are length x
length, so `--max-tokens` is what the machine affords (4,096 on a 2-core CPU). Per row: perplexity by position
bucket and by a token's offset inside its block (icl_eval/perplexity/lengths.py); OUT/results.json.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

BUCKETS = (512, 1024, 2048, 4096, 8192, 16384, 32768)


@dataclass(frozen=True)
class SinkRun:
    """One `evalm eval sink`, typed at its edge."""

    hf_model: str
    book: str
    out: str
    max_tokens: int = 4096
    window: int = 1024
    sinks: tuple[int, ...] = (0, 1, 4, 16)


def window_mask(length: int, window: int, ext: int, sink: int):
    """(length, length) bool, True where the query (row) reads the key (column) exactly: EVA's local rule plus
    the first `sink` positions for every query, and no summaries."""
    import torch

    from evalm.tiling import Tiling

    rule = Tiling(window=window, chunk=window, ext=ext, exclude_window_chunks=True, scale=1.0)  # chunk: unused here
    i, j = torch.arange(length)[:, None], torch.arange(length)[None, :]
    return (j <= i) & ((j >= rule.window_start(i)) | (j < sink))


def masked_nll(model, tokens: list[int], mask):
    """Per-token NLL of a `transformers` causal LM with softmax attention under `mask` (one forward, the mask as
    a 4D additive float mask, which transformers passes to its attention as given)."""
    import torch

    ids = torch.tensor([tokens])
    additive = torch.zeros(mask.shape, dtype=model.dtype).masked_fill(~mask, float("-inf"))[None, None]
    with torch.no_grad():
        logits = model(input_ids=ids[:, :-1], attention_mask=additive[..., :-1, :-1], use_cache=False).logits
        return torch.nn.functional.cross_entropy(logits[0].double(), ids[0, 1:], reduction="none").numpy()


def run(job: SinkRun) -> dict:
    """Every (geometry, sink) row on the book's first `max_tokens` tokens; written to OUT/results.json."""
    from evalm.config_toolkit.machine import peak_rss_gib
    from evalm.icl_eval.models.hf import load_hf
    from evalm.icl_eval.perplexity.books import iter_books
    from evalm.icl_eval.perplexity.lengths import block_offsets, bucket_report, token_spans
    from evalm.storage import RunFolder

    with RunFolder(job.out, "evalm eval sink", inputs=[job.hf_model, job.book]).held() as folder:
        lm = load_hf(job.hf_model)  # float32, sdpa: softmax attention that takes a 4D mask as given
        model = lm.model.eval()
        name, text = next(iter_books([job.book], 1))
        tokens = ([lm.tokenizer.eos_id] + lm.tokenizer.encode(text))[: job.max_tokens + 1]
        words, token_bytes = token_spans(lm.tokenizer, tokens)
        edges = (*(b for b in BUCKETS if b < len(tokens) - 1), len(tokens) - 1)  # the last bucket ends where the tokens do
        rows = []
        for geometry, ext in (("block", 0), ("overlap", job.window)):
            for first in job.sinks:
                start = time.perf_counter()
                nll = masked_nll(model, tokens, window_mask(len(tokens), job.window, ext, first))
                rows.append({"window": geometry, "sink": first, "buckets": bucket_report([(nll, words, name, token_bytes)], edges),
                             "block_offsets": block_offsets([nll], job.window), "seconds": time.perf_counter() - start})
                print(f"{geometry:>8} sink {first:>3}: " + "  ".join(
                    f"[{r['offsets'][0]}, {r['offsets'][1]}) {r['token_ppl']:.1f}" for r in rows[-1]["block_offsets"]),
                    flush=True)
        result = {**asdict(job), "book_name": name, "tokens": len(tokens) - 1, "rows": rows, "peak_rss_gib": peak_rss_gib()}
        folder.write_json("results.json", result)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    from evalm.config_toolkit import Parser
    from evalm.icl_eval.cli_args import csv

    p = Parser(prog="evalm eval sink", description=__doc__.split("\n\n")[0])
    p.add_argument("--hf-model", required=True, metavar="DIR", help="a local transformers causal LM folder (softmax attention) (required)")
    p.add_argument("--book", required=True, metavar="FILE", help="the .txt book scored from its start (required)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (results.json) (required)")
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens scored (default: 4096; the mask is length x length)")
    p.add_argument("--window", type=int, default=1024, help="EVA's window w of the mask (default: 1024)")
    p.add_argument("--sinks", type=csv(int), default=(0, 1, 4, 16), metavar="S1,S2",
                   help="first tokens every query reads, one row each (default: 0,1,4,16)")
    args = p.parse_args(argv)
    for flag, value in (("--max-tokens", args.max_tokens), ("--window", args.window)):
        if value < 1:
            p.error(f"{flag} must be >= 1, got {value}")
    if min(args.sinks) < 0:
        p.error(f"--sinks must be >= 0 each, got {list(args.sinks)}")
    if not Path(args.hf_model).is_dir():
        p.error(f"--hf-model {args.hf_model}: no such folder; give a local transformers model folder")
    if not Path(args.book).is_file():
        p.error(f"--book {args.book}: no such file; give a .txt book")
    run(SinkRun(args.hf_model, args.book, args.out, args.max_tokens, args.window, tuple(args.sinks)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
