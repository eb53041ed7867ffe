"""Demonstration selection (docs/evaluation.md): an ordered list, never a set, never the test item.

- `dataset_level`: a seeded `random.Random` draws k training items, in draw order, the same for every
  test item (so the context cache is reused); optionally label-balanced (round-robin over labels).
- `top_k`: per test item, the k most similar training items by TF-IDF cosine similarity, ordered
  with the most similar last, i.e. nearest to the test input (EVALM §4.4, Liu et al. 2022).
Too few training items is an error that says how many exist (llm-foundry samples silently).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from evalm.config_toolkit import UserError


class NotEnoughItems(UserError, ValueError):
    """Fewer candidate demonstrations than shots requested."""


def dataset_level(
    n_train: int, k: int, seed: int, exclude: Sequence[int] = (), labels: Sequence[int] | None = None
) -> list[int]:
    """k training indices in a seeded order, none of them in `exclude`.

    With `labels`, the draw is label-balanced: each label's items are shuffled, then taken
    round-robin over labels in a seeded label order (so k=3 over 2 labels gives 2 + 1).
    """
    excluded = set(exclude)
    pool = [i for i in range(n_train) if i not in excluded]
    if k > len(pool):
        raise NotEnoughItems(
            f"{k} demonstrations requested but only {len(pool)} training items are available "
            f"({n_train} in the split, {n_train - len(pool)} excluded as test/validation items)"
        )
    rng = random.Random(seed)
    if labels is None:
        return rng.sample(pool, k)
    by_label: dict[int, list[int]] = {}
    for i in pool:
        by_label.setdefault(labels[i], []).append(i)
    order = sorted(by_label)
    rng.shuffle(order)
    for members in by_label.values():
        rng.shuffle(members)
    out: list[int] = []
    while len(out) < k:
        for lab in order:
            if by_label[lab] and len(out) < k:
                out.append(by_label[lab].pop())
    return out


class TopK:
    """Instance-level Top-k by TF-IDF cosine similarity (scikit-learn), fitted on the training texts."""

    def __init__(self, train_texts: Sequence[str]):
        from sklearn.feature_extraction.text import TfidfVectorizer

        self.n_train = len(train_texts)
        self.vectorizer = TfidfVectorizer()
        try:
            self.matrix = self.vectorizer.fit_transform(train_texts)  # (N, vocab), L2-normalised rows
        except ValueError:  # every word a single character (the synthetic family): count those as words too
            self.vectorizer = TfidfVectorizer(token_pattern=r"(?u)\b\w+\b")
            self.matrix = self.vectorizer.fit_transform(train_texts)

    def similarities(self, text: str):
        """Cosine similarity of `text` to every training text, shape (N,)."""
        return (self.matrix @ self.vectorizer.transform([text]).T).toarray().ravel()

    def select(self, text: str, k: int, exclude: Sequence[int] = ()) -> list[int]:
        """k training indices, least similar first and most similar last (next to the test input)."""
        available = self.n_train - len(set(exclude))
        if k > available:
            raise NotEnoughItems(f"{k} demonstrations requested but only {available} training items are available")
        sims = self.similarities(text)
        for i in exclude:
            sims[i] = -1.0
        # stable: ties broken by index, so the choice is deterministic
        ranked = sorted(range(self.n_train), key=lambda i: (-sims[i], i))[:k]
        return ranked[::-1]
