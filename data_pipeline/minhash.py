"""1-gram MinHash fingerprints, bit-identical to datasketch 2.x `MinHash` (docs/data_pipeline.md).

A document's fingerprint set is its set of whitespace tokens (EVALM Appendix A.1: "whitespace-
tokenized ... vectorized with the 1-gram language model"). datasketch's default scheme since 2.0,
"affine32", hashes a token t as

    h(t)   = fmix32(sha1_32(utf8(t)))              (MurmurHash3 finaliser of SHA-1's first 4 bytes)
    v_k(t) = a_k * h(t) + b_k  mod 2^32             (k = 1..num_perm; a_k odd, from RandomState(seed))
    sig_k  = min over tokens of v_k(t)

`datasketch.MinHash.bulk` recomputes SHA-1 for every token of every document. Natural text
reuses a small vocabulary, so here h(t) is computed once per distinct token and cached (at most
`max_vocab` tokens, then the cache starts afresh; ~130 B a token with its dict entry and string,
~130 MB at the default 2^20); a document costs one dict
lookup per token plus the affine step and a min over its tokens, in numpy, uint32 arithmetic
exactly as datasketch's. Measured alternatives that lost (benchmarks/dedup.py, on one core):
caching the permuted rows v(t) instead (512 B a token; filling and growing that table cost more
on a fresh stream than the gather saved on a warm one), and one `np.minimum.reduceat` over a
batch of documents instead of a min per document (numpy's reduceat along axis 0 was ~25x slower).
The permutations are taken from datasketch itself, so scheme, seed and num_perm mean the same
thing in both, and tests compare the signatures for equality.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from hashlib import sha1
from itertools import islice
from operator import itemgetter

import numpy as np
from datasketch import LeanMinHash, MinHash

SCHEME = "affine32"
_EMPTY = np.uint32(0xFFFFFFFF)  # datasketch's initial value: the signature of an empty set


def token_set(text: str) -> set[str]:
    """The fingerprinted set: distinct whitespace tokens of the normalised text."""
    return set(text.split())


def _fmix32(h: np.ndarray) -> np.ndarray:
    # MurmurHash3 finaliser, the pre-mix datasketch applies once per input hash (uint32 wraps).
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


class Fingerprinter:
    """Signatures for many documents; one instance per task (it caches the vocabulary's hashes)."""

    def __init__(self, num_perm: int = 128, seed: int = 1, max_vocab: int = 1 << 20):
        a, b = MinHash(num_perm=num_perm, seed=seed, scheme=SCHEME).permutations
        self.num_perm, self.seed = num_perm, seed
        self._a, self._b = a.astype(np.uint32), b.astype(np.uint32)
        self._max_vocab = max_vocab
        # token -> row of self._hashes. A lookup of an unseen token inserts it with the next row
        # (default_factory = len, all in C), so one pass both finds the rows and collects the new
        # tokens, which are then the newest keys of the (insertion-ordered) dict.
        self._rows: defaultdict[str, int] = defaultdict()
        self._rows.default_factory = self._rows.__len__
        self._hashes = np.empty(1024, dtype=np.uint32)  # h(t) by row; 4 bytes a token

    def _row_ids(self, tokens: set[str]) -> np.ndarray:
        if len(tokens) == 1:  # itemgetter of one key returns the value, not a tuple
            return np.array([self._rows[next(iter(tokens))]], dtype=np.intp)
        return np.fromiter(itemgetter(*tokens)(self._rows), dtype=np.intp, count=len(tokens))

    def _hash_new_rows(self, start: int) -> None:
        """h(t) for the tokens given rows start.. by the last lookups (SHA-1 once per token)."""
        stop = len(self._rows)
        new = list(islice(reversed(self._rows), stop - start))[::-1]
        # sha1_hash32 is struct.unpack("<I", sha1(b).digest()[:4]): unpack all digests at once,
        # every 5th little-endian uint32 of the concatenated 20-byte digests
        digests = b"".join([sha1(t.encode("utf-8")).digest() for t in new])
        if stop > len(self._hashes):
            self._hashes = np.concatenate([self._hashes[:start], np.empty(max(stop, 2 * len(self._hashes)) - start, np.uint32)])
        self._hashes[start:stop] = _fmix32(np.frombuffer(digests, dtype="<u4")[::5].astype(np.uint32))

    def signatures(self, token_sets: Iterable[Iterable[str]]) -> np.ndarray:
        """Signatures of documents given as token sets: shape (n, num_perm), uint32."""
        sets = [s if isinstance(s, (set, frozenset)) else set(s) for s in token_sets]
        out = np.full((len(sets), self.num_perm), _EMPTY, dtype=np.uint32)
        buf = np.empty(max(map(len, sets), default=0) * self.num_perm, dtype=np.uint32)
        for i, tokens in enumerate(sets):
            if not tokens:
                continue
            if len(self._rows) > self._max_vocab:  # bounded memory: start the cache afresh
                self._rows.clear()
            start = len(self._rows)
            rows = self._row_ids(tokens)
            if len(self._rows) > start:
                self._hash_new_rows(start)
            # v_k(t) = a_k * h(t) + b_k in uint32 (the wraparound is datasketch's mod 2^32)
            # laid out (num_perm, tokens): each numpy inner loop runs over a document's tokens
            v = buf[: len(tokens) * self.num_perm].reshape(self.num_perm, len(tokens))
            np.multiply(self._a[:, None], self._hashes.take(rows), out=v)
            v += self._b[:, None]
            v.min(axis=1, out=out[i])
        return out


def lean(signature: np.ndarray, seed: int) -> LeanMinHash:
    """A datasketch LeanMinHash for the LSH index (no copy of the permutations)."""
    return LeanMinHash(seed=seed, hashvalues=signature, scheme=SCHEME)


def lean_bytes(signature: np.ndarray, seed: int) -> bytes:
    """LeanMinHash's own byte format (seed, size, scheme, values): what Redis caches, never pickle."""
    m = lean(signature, seed)
    buf = bytearray(m.bytesize())
    m.serialize(buf)
    return bytes(buf)
