"""An independent per-token implementation of causal EVA (docs/eva.md, "The closed form"), in NumPy float64.

It shares no code with evalm/eva.py: loops over queries, keys and chunks exactly as the closed
form reads, with the module's parameters read out as plain arrays. The one definition it takes
from the package is attention dropout's keep mask (evalm/dropout_mask.py), to replay it.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from evalm import dropout_mask


def _np(t):
    return t.detach().double().cpu().numpy()


def t5_bucket_ref(distance: int, num_buckets: int, max_distance: int) -> int:
    max_exact = num_buckets // 2
    if distance < max_exact:
        return distance
    return min(num_buckets - 1, max_exact + int(math.log(distance / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)))


def _affine(x, lin):
    return x @ _np(lin.weight).T + _np(lin.bias)


def _adaptive(x, seq):
    y = _affine(x, seq[0])
    if len(seq) > 1:  # LayerNorm(D)
        ln = seq[1]
        y = (y - y.mean()) / math.sqrt(y.var() + ln.eps) * _np(ln.weight) + _np(ln.bias)
    return y


def _softmax(xs):
    m = max(xs)
    e = [math.exp(x - m) for x in xs]
    z = sum(e)
    return [x / z for x in e]


def eva_per_token(attn, x) -> np.ndarray:
    """Output of EvaAttention `attn` (eval mode) for x (B, T, E), one query at a time."""
    x = _np(x)
    B, T, E = x.shape
    H, D = attn.n_head, attn.head_dim
    q = _affine(x, attn.q_proj).reshape(B, T, H, D)
    k = _affine(x, attn.k_proj).reshape(B, T, H, D)
    v = _affine(x, attn.v_proj).reshape(B, T, H, D)
    return _affine(eva_heads_per_token(attn, q, k, v).reshape(B, T, E), attn.out_proj)


def eva_heads_per_token(attn, q, k, v) -> np.ndarray:
    """EVA of heads q, k, v (B, T, H, D) arrays (already projected, any rotation applied) with the
    window, chunk, A_q/A_k and T5 table of `attn` -> (B, T, H, D), one query at a time."""
    B, T, H, D = q.shape
    w, c, ext, s = attn.window_size, attn.chunk_size, attn.ext, D**-0.5
    table = None
    if attn.rel_pos_bias is not None:
        table = _np(attn.rel_pos_bias.relative_attention_bias.weight)[:, 0]
        nb, maxd = len(table), w + ext
    out = np.zeros((B, T, H, D))
    for b in range(B):
        for h in range(H):
            k_tilde, beta = [], []
            for r in range(T // c):
                qs, ks, vs = q[b, r * c : (r + 1) * c, h], k[b, r * c : (r + 1) * c, h], v[b, r * c : (r + 1) * c, h]
                kt = _adaptive(ks.mean(0), attn.adaptive_mu_k)
                omega = _adaptive(qs.mean(0), attn.adaptive_mu_q) + kt
                lam = [s * float(omega @ ks[j]) - s * float(ks[j] @ ks[j]) / 2 for j in range(c)]
                wts = _softmax(lam)
                k_tilde.append(kt)
                beta.append(sum(wts[j] * vs[j] for j in range(c)))
            for i in range(T):
                lo = max(0, (i // w) * w - ext)
                logits, values = [], []
                for j in range(lo, i + 1):
                    logit = s * float(q[b, i, h] @ k[b, j, h])
                    if table is not None:
                        logit += s * table[t5_bucket_ref(max(0, i - j - ext), nb, maxd)]
                    logits.append(logit)
                    values.append(v[b, j, h])
                n_remote = lo // c if attn.exclude_window_chunks else i // c
                for r in range(n_remote):
                    logits.append(s * float(q[b, i, h] @ k_tilde[r]))
                    values.append(beta[r])
                p = _softmax(logits)
                out[b, i, h] = sum(pi * vi for pi, vi in zip(p, values))
    return out


def _affine_t(x, lin):
    return x @ lin.weight.T + lin.bias


def _adaptive_t(x, seq):
    y = _affine_t(x, seq[0])
    if len(seq) > 1:  # LayerNorm(D), biased variance
        ln, mu = seq[1], y.mean(-1, keepdim=True)
        y = (y - mu) / ((y - mu).pow(2).mean(-1, keepdim=True) + ln.eps).sqrt() * ln.weight + ln.bias
    return y


def eva_per_token_torch(attn, x, dropout: tuple[int, float] | None = None, prefix=None):
    """The same closed form in differentiable torch ops, one query (all heads) at a time: the
    gradient oracle. Reads the module's parameters, so autograd reaches every one of them.

    `dropout` (seed, p) replays attention dropout: each query's joint probabilities times the keep
    decisions of evalm/dropout_mask.py for its keys (token keys by position, chunk r as −1 − r,
    prefix entry m as 2³⁰ + m), scaled by 1/(1 − p). Only the mask's definition is shared with the
    module, not its use. `prefix` (k, v), each (B, H, P, D): entries merged from other caches that
    every query also attends to, with no bias (a cache's `prefix`, Structured Prompting / SAICL)."""
    B, T, E = x.shape
    H, D = attn.n_head, attn.head_dim
    w, c, ext, s = attn.window_size, attn.chunk_size, attn.ext, D**-0.5
    q, k, v = (_affine_t(x, lin).view(B, T, H, D) for lin in (attn.q_proj, attn.k_proj, attn.v_proj))
    table = attn.rel_pos_bias.relative_attention_bias.weight[:, 0] if attn.rel_pos_bias is not None else None
    rows = []
    for b in range(B):
        k_tilde, beta = [], []
        for r in range(T // c):
            qs, ks, vs = (t[b, r * c : (r + 1) * c] for t in (q, k, v))  # (c, H, D)
            kt = _adaptive_t(ks.mean(0), attn.adaptive_mu_k)
            omega = _adaptive_t(qs.mean(0), attn.adaptive_mu_q) + kt  # (H, D)
            lam = s * (ks * omega).sum(-1) - s * ks.pow(2).sum(-1) / 2  # (c, H)
            k_tilde.append(kt)
            beta.append((torch.softmax(lam, 0)[..., None] * vs).sum(0))
        for i in range(T):
            lo = max(0, (i // w) * w - ext)
            logits = s * (k[b, lo : i + 1] * q[b, i]).sum(-1)  # (L, H)
            if table is not None:
                buckets = [t5_bucket_ref(max(0, i - j - ext), len(table), w + ext) for j in range(lo, i + 1)]
                logits = logits + s * table[buckets][:, None]
            values = v[b, lo : i + 1]
            n_remote = lo // c if attn.exclude_window_chunks else i // c
            if n_remote:
                kr, vr = torch.stack(k_tilde[:n_remote]), torch.stack(beta[:n_remote])
                logits = torch.cat([logits, s * (kr * q[b, i]).sum(-1)])
                values = torch.cat([values, vr])
            n_prefix = prefix[0].shape[-2] if prefix is not None else 0
            if n_prefix:
                pk, pv = (t[b].transpose(0, 1) for t in prefix)  # (P, H, D)
                logits = torch.cat([logits, s * (pk * q[b, i]).sum(-1)])
                values = torch.cat([values, pv])
            p = torch.softmax(logits, 0)  # (keys, H)
            if dropout is not None:
                seed, rate = dropout
                ids = torch.tensor([*range(lo, i + 1), *(-1 - r for r in range(n_remote)), *((1 << 30) + m for m in range(n_prefix))])
                kept = dropout_mask.keep(seed, rate, torch.tensor(b), torch.arange(H)[None, :], torch.tensor(i), ids[:, None])
                p = p * kept / (1 - rate)
            rows.append((p[..., None] * values).sum(0).reshape(E))
    return _affine_t(torch.stack(rows).view(B, T, E), attn.out_proj)


def eva_per_token_vectorised(attn, x) -> np.ndarray:
    """`eva_per_token` with each query's sums over keys as NumPy vector ops: still one query at a time
    and the same closed form, fast enough for n in the thousands (O1 on the multi-tile
    and multi-group paths). Checked against the scalar loops above at small n."""
    x = _np(x)
    B, T, E = x.shape
    H, D = attn.n_head, attn.head_dim
    w, c, ext, s = attn.window_size, attn.chunk_size, attn.ext, D**-0.5
    q, k, v = (_affine(x, lin).reshape(B, T, H, D) for lin in (attn.q_proj, attn.k_proj, attn.v_proj))
    table = _np(attn.rel_pos_bias.relative_attention_bias.weight)[:, 0] if attn.rel_pos_bias is not None else None
    bias = None
    if table is not None:  # bias by distance i - j - ext (clamped at 0), one entry per distance
        bias = np.array([s * table[t5_bucket_ref(d, len(table), w + ext)] for d in range(w + ext + 1)])
    out = np.zeros((B, T, H, D))
    for b in range(B):
        for h in range(H):
            k_tilde, beta = np.zeros((T // c, D)), np.zeros((T // c, D))
            for r in range(T // c):
                qs, ks, vs = (t[b, r * c : (r + 1) * c, h] for t in (q, k, v))
                k_tilde[r] = _adaptive(ks.mean(0), attn.adaptive_mu_k)
                omega = _adaptive(qs.mean(0), attn.adaptive_mu_q) + k_tilde[r]
                lam = s * (ks @ omega) - s * (ks * ks).sum(1) / 2
                wts = np.exp(lam - lam.max())
                beta[r] = (wts / wts.sum()) @ vs
            for i in range(T):
                lo = max(0, (i // w) * w - ext)
                local = s * (k[b, lo : i + 1, h] @ q[b, i, h])
                if bias is not None:
                    local = local + bias[np.maximum(0, i - np.arange(lo, i + 1) - ext)]
                n_remote = lo // c if attn.exclude_window_chunks else i // c
                logits = np.concatenate([local, s * (k_tilde[:n_remote] @ q[b, i, h])])
                p = np.exp(logits - logits.max())
                p /= p.sum()
                out[b, i, h] = p[: len(local)] @ v[b, lo : i + 1, h] + p[len(local) :] @ beta[:n_remote]
    return _affine(out.reshape(B, T, E), attn.out_proj)
