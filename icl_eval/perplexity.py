"""Perplexity vs context length (ICL_SPEC §6; EVALM §4.4 and Figure 4; PG-19).

Each book is its own sequence, `[bos]` then its tokens. `cached` encodes it in segments of the
training length through the cache, so every token is scored with all of its preceding context
(the first token of a segment is predicted by the last logit of the previous one). Baselines on
the same tokens: `nonoverlap` (independent windows; a token sees only its window) and `sliding`
(windows of W advancing by S; each token is scored once, in the first window where it has at least
W - S tokens of context, the HKUNLP `eval_lm --context-window` protocol).

Per position bucket: mean token NLL, token perplexity, bits per byte, and word perplexity (total
NLL over the bucket's tokens divided by the number of whitespace words in the bucket's text span,
the PG-19 authors' tokenizer-independent measure), and how many books reach the bucket.

References on the same tokens (ICL_SPEC §6): `uniform` (perplexity = vocabulary size) and
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

from evalm.icl_eval.bootstrap import REPLICATES, hierarchical_interval
from evalm.icl_eval.lm import CausalLM


def _nll(logits: torch.Tensor, targets: torch.Tensor) -> np.ndarray:
    wide = torch.promote_types(logits.dtype, torch.float32)  # float32, or float64 when given
    return torch.nn.functional.cross_entropy(logits.to(wide), targets.to(logits.device), reduction="none").cpu().double().numpy()


@torch.no_grad()
def cached_nll(lm: CausalLM, tokens: list[int], segment_tokens: int) -> np.ndarray:
    """NLL of tokens[1:] (index i is token i + 1), each with its whole prefix, through the cache."""
    state = lm.new_state(0)
    out, last = [], None
    for i in range(0, len(tokens), segment_tokens):
        seg = torch.tensor([tokens[i : i + segment_tokens]])
        logits = lm.extend(state, seg)[0]
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
def fixed_position(lm: CausalLM, books: list[tuple[str, list[int]]], contexts, target_tokens: int,
                   targets_per_book: int, segment_tokens: int, unigram_logp: np.ndarray | None = None) -> dict:
    """The same target tokens scored after contexts of each length (ICL_SPEC §6, context use).

    Targets of a book: `targets_per_book` spans of `target_tokens`, spread evenly over the part of
    the book after max(contexts) tokens (adjacent spans would all sample one scene), so every
    context length fits before every target. Each (target, context) pair is encoded from scratch
    through the cache: tokens[s - L : s + K], last K scored. Each row carries the change against
    the shortest context, paired on the same spans, with a bootstrap interval over spans.
    """
    longest = max(contexts)
    span_nll = {L: [] for L in contexts}  # per span: mean NLL of its K target tokens
    targets, used = [], []
    for name, tokens in books:
        starts = target_starts(len(tokens), longest, target_tokens, targets_per_book)
        if starts:
            used.append(name)
        for s in starts:
            targets.append(np.asarray(tokens[s: s + target_tokens]))
            for L in contexts:
                seq = tokens[s - L: s + target_tokens]
                span_nll[L].append(float(cached_nll(lm, seq, segment_tokens)[-target_tokens:].mean()))
    if not targets:
        raise ValueError(f"no book has {longest + target_tokens} tokens for the fixed-position protocol; "
                         "lower the longest context or the target length")
    shortest = np.asarray(span_nll[min(contexts)])
    rows = []
    for L in contexts:
        per_span = np.asarray(span_nll[L])
        deltas = per_span - shortest  # paired on the spans: one "seed", spans resampled (icl_eval.bootstrap)
        delta, (lo, hi) = float(deltas.mean()), hierarchical_interval([deltas], [range(len(deltas))])
        rows.append({"context": L, "tokens": len(per_span) * target_tokens, "mean_nll": float(per_span.mean()),
                     "token_ppl": math.exp(float(per_span.mean())),
                     "vs_shortest": {"context": min(contexts), "delta_nll": delta, "delta_nll_ci95": [lo, hi],
                                     "ppl_ratio": math.exp(delta), "ppl_ratio_ci95": [math.exp(lo), math.exp(hi)]}})
    every = np.concatenate(targets)
    references = {"uniform": {"token_ppl": float(lm.tokenizer.vocab_size)}}
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


def evaluate(lm: CausalLM, books: list[tuple[str, str]], max_tokens: int, segment_tokens: int, buckets,
             baselines=("nonoverlap", "sliding"), window: int | None = None, stride: int | None = None,
             progress=None, unigram_logp: np.ndarray | None = None, fixed: dict | None = None) -> dict:
    """Every protocol on every book, with the uniform and unigram references on the same tokens.

    Returns {"books", "protocols": {name: {"protocol", "buckets", "overall"}}, "references": {...},
    "fixed_position": {...} (when `fixed` gives contexts, target_tokens, targets_per_book)}.
    """
    window = window or segment_tokens
    stride = stride or max(1, window // 2)
    if lm.max_positions is not None:
        window = min(window, lm.max_positions)
        if max_tokens > lm.max_positions:
            raise ValueError(
                f"max_tokens={max_tokens} exceeds the model's {lm.max_positions} positions: the cached protocol "
                f"would use positions it never learned; lower the largest --lengths bucket to {lm.max_positions}"
            )
    protocols = {"cached": lambda toks: cached_nll(lm, toks, segment_tokens)}
    if "nonoverlap" in baselines:
        # windows share one token, so every token is predicted once, with context from its own window only
        protocols["nonoverlap"] = lambda toks: window_nll(lm, toks, window, window - 1)
    if "sliding" in baselines:
        protocols["sliding"] = lambda toks: window_nll(lm, toks, window, stride)
    vocab = lm.tokenizer.vocab_size
    references = {"uniform": lambda toks: np.full(len(toks) - 1, math.log(vocab))}
    if unigram_logp is not None:
        references["unigram"] = lambda toks: -unigram_logp[np.asarray(toks[1:])]
    per_protocol: dict[str, list] = {name: [] for name in [*protocols, *references]}
    book_rows, book_tokens = [], []
    for name, text in books:
        tokens = ([lm.tokenizer.eos_id] + lm.tokenizer.encode(text))[: max_tokens + 1]
        words, token_bytes = token_spans(lm.tokenizer, tokens)
        book_rows.append({"book": name, "tokens": len(tokens) - 1, "words": len(words), "bytes": int(token_bytes.sum())})
        if fixed:  # only the fixed-position protocol needs the books again
            book_tokens.append((name, tokens[1:]))
        for proto, fn in {**protocols, **references}.items():
            per_protocol[proto].append((fn(tokens), words, name, token_bytes))
        if progress:
            progress(1)
    described = {
        "cached": {"protocol": "incremental encoding through the cache; every token sees its whole prefix",
                   "segment_tokens": segment_tokens},
        "nonoverlap": {"protocol": "non-overlapping windows (sharing one token), each encoded from scratch",
                       "window_tokens": window, "stride_tokens": window - 1},
        "sliding": {"protocol": "sliding windows; each token scored once with >= window - stride context",
                    "window_tokens": window, "stride_tokens": stride},
        "uniform": {"protocol": f"reference: uniform over the {vocab} token ids (perplexity = vocabulary size)"},
        "unigram": {"protocol": "reference: unigram token frequencies of the training shards, add-one smoothed"},
    }
    report = {name: {"protocol": described[name], "buckets": bucket_report(rows, buckets), "overall": _overall(rows)}
              for name, rows in per_protocol.items()}
    out = {"books": book_rows, "protocols": {k: v for k, v in report.items() if k in protocols},
           "references": {k: v for k, v in report.items() if k in references}}
    if fixed:
        out["fixed_position"] = fixed_position(lm, book_tokens, fixed["contexts"], fixed["target_tokens"],
                                               fixed["targets_per_book"], segment_tokens, unigram_logp)
    return out


def _overall(rows) -> dict:
    total = sum(float(np.nansum(r[0])) for r in rows)
    count = sum(int(np.isfinite(r[0]).sum()) for r in rows)
    words = sum(len(r[1]) for r in rows)
    n_bytes = sum(int(r[3][np.isfinite(r[0])].sum()) for r in rows)
    return {"tokens": count, **_rates(total, count, words, n_bytes)}
