"""The recall families as pure seeded generators: one item's texts, answers and chance, no tokens yet.

Each family returns a `Spec`: an instruction (before the haystack), the needles, the question(s)
after the haystack with their gold answers, how an answer is read from a generation, and two
reference rates (`chance`: a uniform guess over the answer's space; `context_guess`: a uniform
guess among the answers the context offers, e.g. one of the kv_recall values). Placement in the
haystack and exact token lengths are `icl_eval.recall.layout`'s.

- passkey (Mohtashami & Jaggi 2023, "Landmark Attention", App. passkey retrieval): a 1-50,000 pass
  key in the filler, asked at the end;
- niah_single / niah_multikey / niah_multivalue / niah_multiquery (Hsieh et al. 2024, RULER, Table 2
  and its templates): "One of the special magic numbers for {key} is: {value}." with 7-digit values
  and adjective-noun keys; multikey hides distractor keys, multivalue asks every value of one key,
  multiquery every value of several keys;
- variable_tracking (RULER): chains "VAR X = 12345", "VAR Y = VAR X", ... of 5-letter names, one asked
  by its value, the others distractors;
- kv_recall (Yen et al. 2025, HELMET, JSON KV): a JSON object of UUID pairs, one key asked;
- mqar (Arora et al. 2023, Zoology, MQAR): key-value pairs, then every key again in turn, each to be
  answered with its value (the next query continues after the gold value, as Zoology's labels do).

`group` holds the needles placed at the stated depth (the first exactly there, the rest spread after
it); `others` are placed at seeded positions. The same seed gives the same Spec whatever the length.
"""

from __future__ import annotations

import json
import math
import random
import string
import uuid
from dataclasses import dataclass

from evalm.icl_eval.recall.vocabulary import ADJECTIVES, NOUNS

PASSKEY_MAX = 50_000
"""Mohtashami & Jaggi draw the pass key from 1..50,000."""
NIAH_TEMPLATE = " One of the special magic numbers for {key} is: {value}."
NIAH_INSTRUCTION = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
                    "I will quiz you about the numbers afterwards.")
MQAR_VALUES = tuple(str(v) for v in range(10, 100))
"""MQAR's values: 90 two-digit numbers (its keys are nouns: Zoology's two disjoint vocabularies)."""


@dataclass(frozen=True)
class Spec:
    """One item of one family, as text."""

    task: str
    instruction: str
    group: tuple[str, ...]
    """Needles at the stated depth: the first exactly there, the rest evenly spread between it and the end."""
    others: tuple[str, ...]
    """Needles at seeded unit boundaries, in this order (distractors, the other chains)."""
    questions: tuple[str, ...]
    """Text after the haystack; several only for mqar, each continuing after the previous gold answer."""
    golds: tuple[tuple[str, ...], ...]
    """Per question, the answer(s) it must produce (a set for `numbers` and `names`)."""
    answer_texts: tuple[str, ...]
    """Per question, the gold answer as the model would write it (mqar's teacher forcing; generation budget)."""
    kind: str
    """How an answer is read from a generation (icl_eval.recall.scoring.EXTRACT)."""
    haystack: str
    chance: float
    context_guess: float
    asked_words: tuple[str, ...] = ()
    """Words of the asked key(s), kept out of a `words` haystack: a distractor must not be the key asked."""


def spec(task: str, rng: random.Random, config) -> Spec:
    return FAMILIES[task](rng, config)


def _number(rng: random.Random, digits: int = 7) -> str:
    return str(rng.randint(10 ** (digits - 1), 10**digits - 1))


def _keys(rng: random.Random, n: int) -> list[str]:
    """n distinct RULER-style keys, "adjective-noun"."""
    picks = rng.sample(range(len(ADJECTIVES) * len(NOUNS)), n)
    return [f"{ADJECTIVES[i // len(NOUNS)]}-{NOUNS[i % len(NOUNS)]}" for i in picks]


def passkey(rng: random.Random, config) -> Spec:
    key = str(rng.randint(1, PASSKEY_MAX))
    return Spec("passkey", "There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
                "it. I will quiz you about the important information there.",
                (f" The pass key is {key}. Remember it. {key} is the pass key.",), (),
                (" What is the pass key? The pass key is",), ((key,),), (f" {key}.",), "number", "filler",
                1 / PASSKEY_MAX, 1.0)


def _niah(task: str, rng: random.Random, config, n_keys: int, n_values: int, n_asked: int) -> Spec:
    """RULER's needles: n_keys keys with n_values values each; the first n_asked keys are asked."""
    keys = _keys(rng, n_keys)
    values = [[_number(rng) for _ in range(n_values)] for _ in keys]
    asked = keys[:n_asked]
    group = tuple(NIAH_TEMPLATE.format(key=k, value=v) for k, vs in zip(asked, values) for v in vs)
    others = tuple(NIAH_TEMPLATE.format(key=k, value=v) for k, vs in zip(keys[n_asked:], values[n_asked:]) for v in vs)
    gold = tuple(v for vs in values[:n_asked] for v in vs)
    named = asked[0] if n_asked == 1 else ", ".join(asked[:-1]) + " and " + asked[-1]
    if len(gold) == 1:
        question = (f" What is the special magic number for {named} mentioned in the provided text? "
                    f"The special magic number for {named} mentioned in the provided text is")
    else:
        question = (f" What are all the special magic numbers for {named} mentioned in the provided text? "
                    f"The special magic numbers for {named} mentioned in the provided text are")
    kind = "number" if len(gold) == 1 else "numbers"
    offered = n_keys * n_values  # numbers in the context; the asked ones are a subset of this size
    return Spec(task, NIAH_INSTRUCTION, group, others, (question,), (gold,), (" " + ", ".join(gold) + ".",), kind,
                config.haystack, (1 / 9e6) ** len(gold), 1 / math.comb(offered, len(gold)),
                tuple(word for key in asked for word in key.split("-")))


def niah_single(rng, config) -> Spec:
    return _niah("niah_single", rng, config, 1, 1, 1)


def niah_multikey(rng, config) -> Spec:
    return _niah("niah_multikey", rng, config, config.niah_keys, 1, 1)


def niah_multivalue(rng, config) -> Spec:
    return _niah("niah_multivalue", rng, config, 1, config.niah_values, 1)


def niah_multiquery(rng, config) -> Spec:
    return _niah("niah_multiquery", rng, config, config.niah_queries, 1, config.niah_queries)


def variable_tracking(rng: random.Random, config) -> Spec:
    """RULER's VT: `vt_chains` chains of vt_hops + 1 names; the first chain is asked by its value."""
    size = config.vt_hops + 1
    names: list[str] = []
    while len(names) < config.vt_chains * size:
        name = "".join(rng.choice(string.ascii_uppercase) for _ in range(5))
        names += [name] if name not in names else []
    chains, values = [names[i * size : (i + 1) * size] for i in range(config.vt_chains)], []
    while len(values) < len(chains):  # RULER's 5-digit values, one per chain, distinct
        value = _number(rng, 5)
        values += [value] if value not in values else []
    statements = [[f" VAR {c[0]} = {v}."] + [f" VAR {c[i]} = VAR {c[i - 1]}." for i in range(1, size)]
                  for c, v in zip(chains, values)]
    question = (f" Question: Find all variables that are assigned the value {values[0]} in the text above. Answer: "
                f"According to the chain(s) of variable assignment in the text above, {size} variables are assigned "
                f"the value {values[0]}, they are:")
    return Spec("variable_tracking", "Memorize and track the chain(s) of variable assignment hidden in the following "
                "text.", tuple(statements[0]), tuple(s for chain in statements[1:] for s in chain), (question,),
                (tuple(chains[0]),), (" " + " ".join(chains[0]),), "names", config.haystack,
                1 / math.comb(26**5, size), 1 / math.comb(len(names), size))


def kv_recall(rng: random.Random, config) -> Spec:
    """HELMET's JSON KV: the object is one needle; the asked pair sits at a seeded place inside it."""
    pairs = [(str(uuid.UUID(int=rng.getrandbits(128), version=4)), str(uuid.UUID(int=rng.getrandbits(128), version=4)))
             for _ in range(config.kv_pairs)]
    key, value = pairs[rng.randrange(len(pairs))]
    question = ("\n\nExtract the value corresponding to the specified key in the JSON object above.\n\n"
                f'Key: "{key}"\nCorresponding value:')
    return Spec("kv_recall", "A JSON object is hidden within the following text. I will ask you for the value of "
                "one of its keys.", (" JSON data: " + json.dumps(dict(pairs)),), (), (question,), ((value,),),
                (f' "{value}"',), "uuid", config.haystack, 2.0**-122, 1 / len(pairs))


def mqar(rng: random.Random, config) -> Spec:
    """Zoology's MQAR as text: "key value" pairs in one block, then each key in a seeded order."""
    keys = rng.sample(NOUNS, config.mqar_pairs)
    values = rng.sample(MQAR_VALUES, config.mqar_pairs)
    order = rng.sample(range(config.mqar_pairs), config.mqar_pairs)
    block = " " + " ".join(f"{k} {v}" for k, v in zip(keys, values))
    questions = tuple(("\nQueries:" if j == 0 else "") + f" {keys[i]}" for j, i in enumerate(order))
    return Spec("mqar", "Keys and their values are hidden in the following text, each key followed by its value. "
                "After the text, each key is given again: answer with its value.", (block,), (), questions,
                tuple((values[i],) for i in order), tuple(f" {values[i]}" for i in order), "number",
                config.haystack, 1 / len(MQAR_VALUES), 1 / config.mqar_pairs, tuple(keys))


FAMILIES = {"passkey": passkey, "niah_single": niah_single, "niah_multikey": niah_multikey,
            "niah_multivalue": niah_multivalue, "niah_multiquery": niah_multiquery,
            "variable_tracking": variable_tracking, "kv_recall": kv_recall, "mqar": mqar}
"""Family name -> generator; the names are config.FAMILIES (checked equal by the tests)."""
