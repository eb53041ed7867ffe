"""Perplexity vs context length (docs/evaluation.md; EVALM §4.4 and Figure 4; PG-19).

Each book is its own sequence, `[bos]` then its tokens. `cached` encodes it in segments of the
training length through the cache, so every token is scored with all of its preceding context
(the first token of a segment is predicted by the last logit of the previous one). Baselines on
the same tokens: `nonoverlap` (independent windows; a token sees only its window) and `sliding`
(windows of W advancing by S; each token is scored once, in the first window where it has at least
W - S tokens of context, the HKUNLP `eval_lm --context-window` protocol).

Per position bucket: mean token NLL, token perplexity, bits per byte, and word perplexity (total
NLL over the bucket's tokens divided by the number of whitespace words in the bucket's text span,
the PG-19 authors' tokenizer-independent measure), and how many books reach the bucket.

References on the same tokens (docs/evaluation.md): `uniform` (perplexity = vocabulary size) and
`unigram` (token frequencies of the training shards, `unigram.py`). A position-bucket curve mixes
two effects, context use and the text getting easier or harder along a book, so `fixed_position`
scores the *same* target tokens given contexts of increasing length: only that curve shows
context use (and, past the training length, extrapolation, EVALM §4.4 and Figure 4).
"""

from __future__ import annotations

import bisect
import math
import sys

import numpy as np
import torch

from evalm.config_toolkit import ConfigError
from evalm.icl_eval.stats.bootstrap import REPLICATES, hierarchical_interval
from evalm.icl_eval.config import PerplexityConfig
from evalm.icl_eval.models.lm import CausalLM


def _nll(logits: torch.Tensor, targets: torch.Tensor) -> np.ndarray:
    wide = torch.promote_types(logits.dtype, torch.float32)  # float32, or float64 when given
    return torch.nn.functional.cross_entropy(logits.to(wide), targets.to(logits.device), reduction="none").cpu().double().numpy()


@torch.no_grad()
def cached_nll(lm: CausalLM, tokens: list[int], segment_tokens: int, tick=None) -> np.ndarray:
    """NLL of tokens[1:] (index i is token i + 1), each with its whole prefix, through the cache; `tick(n)`, when
    given, after each segment with the n tokens it scored (a 131,072-token book is an hour on a CPU: its progress
    line)."""
    state = lm.new_state(0)
    out, last = [], None
    for i in range(0, len(tokens), segment_tokens):
        seg = torch.tensor([tokens[i : i + segment_tokens]])
        logits = lm.extend(state, seg)[0]
        if tick is not None:
            tick(seg.shape[1] - (i == 0))  # the first token is context only
        if last is not None:
            out.append(_nll(last[None], seg[0, :1]))
        out.append(_nll(logits[:-1], seg[0, 1:]))
        last = logits[-1]
    return np.concatenate(out)


@torch.no_grad()
def window_nll(lm: CausalLM, tokens: list[int], window: int, stride: int) -> np.ndarray:
    """NLL of tokens[1:] by re-encoded windows, each token scored once (in the first window that predicts it).

    stride == window - 1 is the non-overlapping baseline (consecutive windows share the one token
    whose logit predicts the next window's first token); a smaller stride is the sliding window."""
    nll = np.full(len(tokens) - 1, np.nan)
    scored_to, start = 0, 0  # nll[:scored_to] is done; nll[t - 1] belongs to tokens[t]
    while True:
        seg = tokens[start : start + window]
        if len(seg) < 2:
            break
        logits = lm.forward(torch.tensor([seg]))[0]
        part = _nll(logits[:-1], torch.tensor(seg[1:], dtype=torch.long))  # part[j] is nll[start + j]
        lo, hi = max(scored_to, start), start + len(part)  # only tokens no earlier window scored
        if hi > lo:
            nll[lo:hi] = part[lo - start :]
        scored_to = max(scored_to, hi)
        if start + window >= len(tokens):
            break
        start += stride
    return nll


def bucket_report(per_book: list[tuple[np.ndarray, list[int], str, np.ndarray]], buckets) -> list[dict]:
    """Per bucket: tokens, books reaching it, mean NLL, token and word perplexity, bits per byte.

    per_book: (NLL of tokens[1:], word start positions, book name, bytes of each of tokens[1:]).
    """
    rows = []
    for b, hi in enumerate(buckets):
        lo = buckets[b - 1] if b else 0
        total, count, words, n_bytes, books = 0.0, 0, 0, 0, []
        for nll, word_pos, name, token_bytes in per_book:
            span = nll[lo:hi]
            if len(span) == 0:
                continue
            scored = np.isfinite(span)
            total += float(np.nansum(span))
            count += int(scored.sum())
            n_bytes += int(token_bytes[lo:hi][scored].sum())
            words += bisect.bisect_left(word_pos, hi) - bisect.bisect_left(word_pos, lo)
            books.append(name)
        if count:
            rows.append({"bucket": [lo, hi], "tokens": count, "books": len(books), "book_names": books,
                         **_rates(total, count, words, n_bytes)})
    return rows


def _rates(total_nll: float, tokens: int, words: int, n_bytes: int) -> dict:
    """Mean NLL (nats), token perplexity, word perplexity and bits per byte of a summed NLL."""
    return {"mean_nll": total_nll / tokens, "token_ppl": _perplexity(total_nll / tokens),
            "word_ppl": _perplexity(total_nll / words) if words else None,
            "bits_per_byte": total_nll / math.log(2) / n_bytes if n_bytes else None}


def _perplexity(mean_nll: float) -> float:
    """exp(mean NLL), inf past the float range: a bucket of text without spaces (CJK, code) can hold
    one "word" of hundreds of tokens, whose NLL (over 709 nats) math.exp cannot raise to."""
    return math.exp(mean_nll) if mean_nll < math.log(sys.float_info.max) else math.inf


OFFSET_EDGES = (16, 64, 256)
"""Where a token sits in its block: its first chunk (EVA's c = 16), the next few, a quarter of a 1,024 block."""


def block_offsets(nlls: list[np.ndarray], block: int) -> list[dict]:
    """Token perplexity by a token's offset inside its `block`-token block, pooled over books, from position
    `block` on (every block there has whole blocks before it). nll[i] is the token at position i + 1."""
    edges = [0, *(e for e in OFFSET_EDGES if e < block), block]
    total, count = np.zeros(len(edges) - 1), np.zeros(len(edges) - 1, dtype=np.int64)
    for nll in nlls:
        pos = np.arange(1, len(nll) + 1)
        keep = (pos >= block) & np.isfinite(nll)
        which = np.searchsorted(edges, pos[keep] % block, side="right") - 1
        np.add.at(total, which, nll[keep])
        np.add.at(count, which, 1)
    return [{"offsets": [lo, hi], "tokens": int(n), "mean_nll": t / n, "token_ppl": _perplexity(t / n)}
            for lo, hi, t, n in zip(edges, edges[1:], total, count) if n]


def token_spans(tokenizer, tokens: list[int]) -> tuple[list[int], np.ndarray]:
    """Word starts (token positions in tokens[1:] indexing) and UTF-8 bytes of each of tokens[1:].

    Decoded token by token: a word counts in the bucket of its first token. The byte count is
    exact for text whose tokens end on character boundaries (always for ASCII, e.g. PG-19); a
    token ending inside a multi-byte character decodes to a replacement character.
    """
    starts, sizes, prev_space = [], np.zeros(max(0, len(tokens) - 1), dtype=np.int64), True
    for i, t in enumerate(tokens[1:]):
        text = tokenizer.decode([t])
        sizes[i] = len(text.encode("utf-8"))
        for ch in text:
            if prev_space and not ch.isspace():
                starts.append(i)
            prev_space = ch.isspace()
    return starts, sizes


@torch.no_grad()
def fixed_spans(lm: CausalLM, tokens: list[int], contexts, target_tokens: int, targets_per_book: int,
                segment_tokens: int) -> tuple[dict[int, list[float]], np.ndarray]:
    """One book's part of the fixed-position protocol (docs/evaluation.md, context use): per context length L, the
    mean NLL of each target span after L tokens, and the spans' tokens, (spans, target_tokens).

    Targets of a book: `targets_per_book` spans of `target_tokens`, spread evenly over the part of
    the book after max(contexts) tokens (adjacent spans would all sample one scene), so every
    context length fits before every target. Each (target, context) pair is encoded from scratch
    through the cache: tokens[s - L : s + K], last K scored."""
    span_nll: dict[int, list[float]] = {L: [] for L in contexts}
    starts = target_starts(len(tokens), max(contexts), target_tokens, targets_per_book)
    for s in starts:
        for L in contexts:
            seq = tokens[s - L: s + target_tokens]
            span_nll[L].append(float(cached_nll(lm, seq, segment_tokens)[-target_tokens:].mean()))
    targets = np.asarray([tokens[s: s + target_tokens] for s in starts], dtype=np.int64).reshape(len(starts), target_tokens)
    return span_nll, targets


def fixed_report(books: list[tuple[str, dict[int, list[float]], np.ndarray]], contexts, target_tokens: int,
                 targets_per_book: int, vocab_size: int, unigram_logp: np.ndarray | None = None) -> dict:
    """The fixed-position rows from every book's `fixed_spans`, in book order. Each row carries the change
    against the shortest context, paired on the same spans, with a bootstrap interval over spans."""
    longest = max(contexts)
    span_nll = {L: [x for _, spans, _ in books for x in spans[L]] for L in contexts}
    targets = [t for _, _, book_targets in books for t in book_targets]
    used = [name for name, _, book_targets in books if len(book_targets)]
    if not targets:
        raise ConfigError(f"no book has {longest + target_tokens} tokens for the fixed-position protocol; "
                          "lower the longest context or the target length")
    shortest = np.asarray(span_nll[min(contexts)])
    rows = []
    for L in contexts:
        per_span = np.asarray(span_nll[L])
        deltas = per_span - shortest  # paired on the spans: one "seed", spans resampled (icl_eval.stats.bootstrap)
        delta, (lo, hi) = float(deltas.mean()), hierarchical_interval([deltas], [range(len(deltas))])
        rows.append({"context": L, "tokens": len(per_span) * target_tokens, "mean_nll": float(per_span.mean()),
                     "token_ppl": math.exp(float(per_span.mean())),
                     "vs_shortest": {"context": min(contexts), "delta_nll": delta, "delta_nll_ci95": [lo, hi],
                                     "ppl_ratio": math.exp(delta), "ppl_ratio_ci95": [math.exp(lo), math.exp(hi)]}})
    every = np.concatenate(targets)
    references = {"uniform": {"token_ppl": float(vocab_size)}}
    if unigram_logp is not None:
        references["unigram"] = {"token_ppl": math.exp(float(-unigram_logp[every].mean()))}
    return {"protocol": {"protocol": "the same target tokens after contexts of increasing length, each encoded "
                         "from scratch through the cache; spans spread evenly after the longest context",
                         "target_tokens": target_tokens, "targets_per_book": targets_per_book, "books": used,
                         "targets": len(targets), "interval": f"95% percentile bootstrap over the {len(targets)} "
                         f"spans ({REPLICATES} draws), paired with the shortest context"},
            "rows": rows, "references": references}


def target_starts(n_tokens: int, longest: int, target_tokens: int, count: int) -> list[int]:
    """Up to `count` span starts, evenly spaced over [longest, n_tokens - target_tokens], distinct."""
    last = n_tokens - target_tokens
    if last < longest or count < 1:
        return []
    room = min(count, (last - longest) // target_tokens + 1)  # never overlap two spans
    if room == 1:
        return [longest]
    return [longest + round(j * (last - longest) / (room - 1)) for j in range(room)]


class Protocols:
    """Every protocol and reference of a run, set up once and applied to one book at a time (`score`);
    `report` turns the books' scores, in book order, into the results (so books may be scored apart,
    e.g. on several ranks, and reported together)."""

    def __init__(self, lm: CausalLM, config: PerplexityConfig, unigram_logp: np.ndarray | None = None):
        """`config`: the run's `[ppl]` settings (its `max_tokens` resolved, `supply.ppl_lengths`);
        `unigram_logp`: the unigram reference's log-probabilities, fitted on the training shards."""
        max_tokens, segment_tokens = config.max_tokens or config.buckets[-1], config.segment_tokens
        window = config.window_tokens or segment_tokens
        stride = config.stride_tokens or max(1, window // 2)
        fixed = {"contexts": config.fixed_contexts, "target_tokens": config.fixed_target_tokens,
                 "targets_per_book": config.fixed_targets_per_book} if config.fixed_contexts else None
        if lm.max_positions is not None:
            window = min(window, lm.max_positions)
            if max_tokens > lm.max_positions and not config.past_positions:
                raise ConfigError(
                    f"max_tokens={max_tokens} exceeds the model's {lm.max_positions} positions: the cached protocol "
                    f"would use positions it never learned; lower the largest --lengths bucket to {lm.max_positions} "
                    "(or set --ppl.past_positions=true to measure what it does there)"
                )
        self.lm, self.max_tokens, self.segment_tokens, self.buckets = lm, max_tokens, segment_tokens, config.buckets
        self.window, self.stride, self.unigram_logp, self.fixed = window, stride, unigram_logp, fixed
        self.offset_block = config.offset_block
        self.protocols = ["cached", *(b for b in ("nonoverlap", "sliding") if b in config.baselines)]
        self.references = ["uniform", *(["unigram"] if unigram_logp is not None else [])]
        self.tick = None  # called with each cached segment's tokens (`evalm eval ppl`'s progress line)

    def _nll(self, name: str, tokens: list[int]) -> np.ndarray:
        if name == "cached":
            return cached_nll(self.lm, tokens, self.segment_tokens, self.tick)
        if name == "nonoverlap":  # windows share one token, so every token is predicted once, with context from its own window only
            return window_nll(self.lm, tokens, self.window, self.window - 1)
        if name == "sliding":
            return window_nll(self.lm, tokens, self.window, self.stride)
        if name == "uniform":
            return np.full(len(tokens) - 1, math.log(self.lm.tokenizer.vocab_size))
        return -self.unigram_logp[np.asarray(tokens[1:])]

    def score(self, name: str, text: str) -> dict:
        """One book: its row, each protocol's NLL of tokens[1:], word starts, bytes per token, fixed-position spans."""
        tokens = ([self.lm.tokenizer.eos_id] + self.lm.tokenizer.encode(text))[: self.max_tokens + 1]
        words, token_bytes = token_spans(self.lm.tokenizer, tokens)
        out = {"row": {"book": name, "tokens": len(tokens) - 1, "words": len(words), "bytes": int(token_bytes.sum())},
               "nll": {p: self._nll(p, tokens) for p in [*self.protocols, *self.references]},
               "words": words, "token_bytes": token_bytes}
        if self.fixed:  # only the fixed-position protocol needs the books again
            f = self.fixed
            out["spans"], out["targets"] = fixed_spans(self.lm, tokens[1:], f["contexts"], f["target_tokens"],
                                                       f["targets_per_book"], self.segment_tokens)
        return out

    def report(self, books: list[dict]) -> dict:
        """{"books", "protocols": {name: {"protocol", "buckets", "overall"}}, "references", "fixed_position"}."""
        vocab = self.lm.tokenizer.vocab_size
        described = {
            "cached": {"protocol": "incremental encoding through the cache; every token sees its whole prefix",
                       "segment_tokens": self.segment_tokens},
            "nonoverlap": {"protocol": "non-overlapping windows (sharing one token), each encoded from scratch",
                           "window_tokens": self.window, "stride_tokens": self.window - 1},
            "sliding": {"protocol": "sliding windows; each token scored once with >= window - stride context",
                        "window_tokens": self.window, "stride_tokens": self.stride},
            "uniform": {"protocol": f"reference: uniform over the {vocab} token ids (perplexity = vocabulary size)"},
            "unigram": {"protocol": "reference: unigram token frequencies of the training shards, add-one smoothed"},
        }
        report = {}
        for name in [*self.protocols, *self.references]:
            rows = [(b["nll"][name], b["words"], b["row"]["book"], b["token_bytes"]) for b in books]
            report[name] = {"protocol": described[name], "buckets": bucket_report(rows, self.buckets),
                            "overall": _overall(rows)}
            if self.offset_block:
                report[name]["block_offsets"] = block_offsets([r[0] for r in rows], self.offset_block)
        out = {"books": [b["row"] for b in books], "protocols": {k: report[k] for k in self.protocols},
               "references": {k: report[k] for k in self.references}}
        if self.fixed:
            f = self.fixed
            out["fixed_position"] = fixed_report([(b["row"]["book"], b["spans"], b["targets"]) for b in books],
                                                 f["contexts"], f["target_tokens"], f["targets_per_book"], vocab,
                                                 self.unigram_logp)
        return out


def evaluate(lm: CausalLM, books: list[tuple[str, str]], config: PerplexityConfig, progress=None,
             unigram_logp: np.ndarray | None = None) -> dict:
    """Every protocol on every book, with the uniform and unigram references on the same tokens.

    Returns {"books", "protocols": {name: {"protocol", "buckets", "overall"}}, "references": {...},
    "fixed_position": {...} (when `config.fixed_contexts` is set)}.
    """
    protocols = Protocols(lm, config, unigram_logp)
    scored = []
    for name, text in books:
        scored.append(protocols.score(name, text))
        if progress:
            progress(1)
    return protocols.report(scored)


def _overall(rows) -> dict:
    total = sum(float(np.nansum(r[0])) for r in rows)
    count = sum(int(np.isfinite(r[0]).sum()) for r in rows)
    words = sum(len(r[1]) for r in rows)
    n_bytes = sum(int(r[3][np.isfinite(r[0])].sum()) for r in rows)
    return {"tokens": count, **_rates(total, count, words, n_bytes)}
