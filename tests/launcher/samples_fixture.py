"""A CI-sized samples folder in the layout `evalm data samples` writes, made from seeded text.

pile/ (Pile jsonl over four kept subsets plus one dropped one and a planted near-duplicate),
books/ (two .txt books), tasks/polarity/ (a task file and splits), instructions/train.jsonl.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

STOP = "the of and to in a is that for it as was with be by on not he i this are or his from at which but have an they you were".split()
CONTENT = ("river garden window summer winter morning evening village market harbour teacher farmer doctor letter story "
           "mountain forest valley bridge station library kitchen journey stranger family friend neighbour city country "
           "music painting theatre history science language question answer reason season weather island castle").split()
VERBS = "walked spoke wrote found opened carried remembered watched painted answered followed built visited crossed".split()


def sentence(rng: random.Random) -> str:
    words = [rng.choice(STOP), rng.choice(CONTENT), rng.choice(VERBS), rng.choice(STOP), rng.choice(STOP),
             rng.choice(CONTENT), rng.choice(STOP), rng.choice(CONTENT)]
    return " ".join(words).capitalize() + "."


def document(rng: random.Random, n_sentences: int) -> str:
    return " ".join(sentence(rng) for _ in range(n_sentences))


def write_samples(root: Path, seed: int = 0) -> Path:
    rng = random.Random(seed)
    (root / "pile").mkdir(parents=True)
    rows = []
    for i, subset in enumerate(["Wikipedia (en)", "Gutenberg (PG-19)", "OpenWebText2", "Pile-CC"] * 10):
        rows.append({"text": document(rng, rng.randint(8, 20)), "meta": {"pile_set_name": subset}})
    rows.append({"text": rows[0]["text"] + " Again.", "meta": {"pile_set_name": "Pile-CC"}})  # near-duplicate
    rows.append({"text": "def f(x): return x", "meta": {"pile_set_name": "Github"}})  # not a kept subset
    for k in range(2):
        (root / "pile" / f"train-{k}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[k::2]))
    (root / "books").mkdir()
    for k in range(2):
        (root / "books" / f"book{k}.txt").write_text("\n".join(document(rng, 10) for _ in range(6)))
    task = root / "tasks" / "polarity"
    task.mkdir(parents=True)
    (task / "task.toml").write_text('[task]\nname = "polarity"\ntemplate = "Review: {text} Sentiment: {label}"\n'
                                    'labels = ["negative", "positive"]\ntrain = "train.jsonl"\ntest = "test.jsonl"\n')
    for split, n in (("train", 40), ("test", 12)):
        items = [{"text": document(rng, 1), "label": rng.randrange(2)} for _ in range(n)]
        (task / f"{split}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in items))
    (root / "instructions").mkdir()
    inst = [{"task": "topic", "input": document(rng, 1), "output": rng.choice(CONTENT)} for _ in range(30)]
    (root / "instructions" / "train.jsonl").write_text("".join(json.dumps(x) + "\n" for x in inst))
    return root
