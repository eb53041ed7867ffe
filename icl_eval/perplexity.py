"""Perplexity vs context length (ICL_SPEC §6; EVALM §4.4 and Figure 4; PG-19).

Each book is its own sequence, `[bos]` then its tokens. `cached` encodes it in segments of the
training length through the cache, so every token is scored with all of its preceding context
(the first token of a segment is predicted by the last logit of the previous one). Baselines on
the same tokens: `nonoverlap` (independent windows; a token sees only its window) and `sliding`
(windows of W advancing by S; each token is scored once, in the first window where it has at least
W - S tokens of context, the HKUNLP `eval_lm --context-window` protocol).

Per position bucket: mean token NLL, token perplexity, and word perplexity (total NLL over the
bucket's tokens divided by the number of whitespace words in the bucket's text span, the PG-19
authors' tokenizer-independent measure), and how many books reach the bucket.
"""

from __future__ import annotations

import bisect
import math

import numpy as np
import torch

from icl_eval.lm import CausalLM


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


def bucket_report(per_book: list[tuple[np.ndarray, list[int], str]], buckets) -> list[dict]:
    """Per bucket: tokens, books reaching it, mean NLL, token and word perplexity.

    per_book: (NLL of tokens[1:], word start positions, book name) per book, from `evaluate`.
    """
    rows = []
    for b, hi in enumerate(buckets):
        lo = buckets[b - 1] if b else 0
        total, count, words, books = 0.0, 0, 0, []
        for nll, word_pos, name in per_book:
            span = nll[lo:hi]
            if len(span) == 0:
                continue
            total += float(np.nansum(span))
            count += int(np.isfinite(span).sum())
            words += bisect.bisect_left(word_pos, hi) - bisect.bisect_left(word_pos, lo)
            books.append(name)
        if count:
            mean = total / count
            rows.append({"bucket": [lo, hi], "tokens": count, "books": len(books), "book_names": books,
                         "mean_nll": mean, "token_ppl": math.exp(mean),
                         "word_ppl": math.exp(total / words) if words else None})
    return rows


def word_starts(text: str, tokenizer, tokens: list[int]) -> list[int]:
    """Token positions (in tokens[1:] indexing) at which a whitespace word starts, for word perplexity.

    Computed by decoding token by token; a word counts in the bucket of its first token.
    """
    starts, prev_space = [], True
    for i, t in enumerate(tokens[1:]):
        for ch in tokenizer.decode([t]):
            if prev_space and not ch.isspace():
                starts.append(i)
            prev_space = ch.isspace()
    return starts


def evaluate(lm: CausalLM, books: list[tuple[str, str]], max_tokens: int, segment_tokens: int, buckets,
             baselines=("nonoverlap", "sliding"), window: int | None = None, stride: int | None = None,
             progress=None) -> dict:
    """Every protocol on every book: {"protocols": {name: {"buckets": [...], "protocol": {...}}}, "books": [...]}."""
    window = window or segment_tokens
    stride = stride or max(1, window // 2)
    if lm.max_positions is not None:
        window = min(window, lm.max_positions)
        if max_tokens > lm.max_positions:
            raise ValueError(
                f"max_tokens={max_tokens} exceeds the model's {lm.max_positions} positions: the cached protocol "
                f"would use positions it never learned; lower ppl.max_tokens"
            )
    protocols = {"cached": lambda toks: cached_nll(lm, toks, segment_tokens)}
    if "nonoverlap" in baselines:
        # windows share one token, so every token is predicted once, with context from its own window only
        protocols["nonoverlap"] = lambda toks: window_nll(lm, toks, window, window - 1)
    if "sliding" in baselines:
        protocols["sliding"] = lambda toks: window_nll(lm, toks, window, stride)
    per_protocol: dict[str, list] = {name: [] for name in protocols}
    book_rows = []
    for name, text in books:
        tokens = ([lm.tokenizer.eos_id] + lm.tokenizer.encode(text))[: max_tokens + 1]
        words = word_starts(text, lm.tokenizer, tokens)
        book_rows.append({"book": name, "tokens": len(tokens) - 1, "words": len(words)})
        for proto, fn in protocols.items():
            per_protocol[proto].append((fn(tokens), words, name))
        if progress:
            progress(1)
    described = {
        "cached": {"protocol": "incremental encoding through the cache; every token sees its whole prefix",
                   "segment_tokens": segment_tokens},
        "nonoverlap": {"protocol": "non-overlapping windows (sharing one token), each encoded from scratch",
                       "window_tokens": window, "stride_tokens": window - 1},
        "sliding": {"protocol": "sliding windows; each token scored once with >= window - stride context",
                    "window_tokens": window, "stride_tokens": stride},
    }
    return {
        "books": book_rows,
        "protocols": {name: {"protocol": described[name], "buckets": bucket_report(rows, buckets),
                             "overall": _overall(rows)} for name, rows in per_protocol.items()},
    }


def _overall(rows) -> dict:
    total = sum(float(np.nansum(r[0])) for r in rows)
    count = sum(int(np.isfinite(r[0]).sum()) for r in rows)
    words = sum(len(r[1]) for r in rows)
    return {"tokens": count, "mean_nll": total / count, "token_ppl": math.exp(total / count),
            "word_ppl": math.exp(total / words) if words else None}
