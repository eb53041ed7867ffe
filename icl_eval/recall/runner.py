"""The recall grid as units: one (task, length, seed) per unit, every item at every depth inside it.

An item is a pure function of (task, seed, index) and the settings: its Spec (families.py), its
haystack and its placements draw from their own `random.Random` streams, so a unit computes the same
records in any process, on any rank, before or after a resume. Within a unit each item's prompts (all
depths) are encoded as one trie (encoding.py); its wall time is the item's cost.

Records -> cells: one per (task, length, depth), the accuracy's mean over seeds of the item means
with the hierarchical bootstrap interval (seeds, then items within each seed: each seed has its own
items, the nested design of icl_eval.stats.bootstrap), beside `chance` and `context_guess`, with
`tokens` (the prompt length read) and the placement actually achieved.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import numpy as np

from evalm.icl_eval.recall import families, scoring
from evalm.icl_eval.recall.encoding import answer_all
from evalm.icl_eval.recall.haystacks import Haystacks
from evalm.icl_eval.recall.layout import Encoded, body_pieces, cut_left, encode_spec, place
from evalm.icl_eval.stats.bootstrap import interval_summary

EXTRA_TOKENS = 4
"""Generation budget beyond twice the gold answer's tokens (room for a space, a quote, a period)."""


@dataclass(frozen=True)
class Unit:
    task: str
    length: int
    seed: int

    @property
    def name(self) -> str:
        return f"{self.task}-{self.length}-seed{self.seed}"


def item_rng(task: str, seed: int, index: int, stream: str) -> random.Random:
    """The item's own stream (`spec`, `haystack`, `place`): string seeds hash the same in every process."""
    return random.Random(f"recall:{task}:{seed}:{index}:{stream}")


def encoded_item(task: str, seed: int, index: int, config, tokenizer, bos) -> tuple[families.Spec, Encoded]:
    spec = families.spec(task, item_rng(task, seed, index, "spec"), config)
    return spec, encode_spec(spec, tokenizer, bos)


class Runner:
    """Scores units with one model; `window` is the room a prompt and its answer have (None: no limit)."""

    def __init__(self, lm, config, bos: tuple[int, ...], haystacks: Haystacks, window: int | None, progress=None):
        self.lm, self.config, self.bos, self.haystacks, self.window = lm, config, tuple(bos), haystacks, window
        self.progress = progress or (lambda n: None)

    def units(self) -> list[Unit]:
        c = self.config
        return [Unit(t, n, s) for t in c.tasks for n in c.lengths for s in c.seeds]

    def run_unit(self, unit: Unit) -> dict:
        """Every item of the unit at every depth: {"records": [...], "cost": [...]}, JSON."""
        records, cost = [], []
        for index in range(self.config.items):
            item_records, item_cost = self.run_item(unit, index)
            records += item_records
            cost.append(item_cost)
            self.progress(1)
        return {"records": records, "cost": cost}

    def run_item(self, unit: Unit, index: int) -> tuple[list[dict], dict]:
        spec, enc = encoded_item(unit.task, unit.seed, index, self.config, self.lm.tokenizer, self.bos)
        units, slack = self.haystacks.take(spec.haystack, item_rng(unit.task, unit.seed, index, "haystack"),
                                           unit.length - enc.fixed, spec.asked_words)
        pieces = body_pieces(units, enc.others, item_rng(unit.task, unit.seed, index, "place"))
        budgets = [2 * len(a) + EXTRA_TOKENS for a in enc.answers]
        placed = [place(enc, pieces, d) for d in self.config.depths]
        if self.window is not None:
            placed = [cut_left(p, self.bos, self.window - max(budgets)) for p in placed]
        order = sorted(range(len(placed)), key=lambda j: (placed[j].needle_at, j))  # the trie's branches in order
        prompts = [p for j in order for p in placed[j].prompts]
        t0 = time.perf_counter()
        decode = self.lm.tokenizer.decode
        outputs, cost = answer_all(self.lm, prompts, budgets * len(placed), self.config.segment_tokens,
                                   lambda ids: scoring.ends_answer(decode(ids)))
        seconds = time.perf_counter() - t0
        texts = iter(decode(o) for o in outputs)
        by_depth = {j: [next(texts) for _ in placed[j].prompts] for j in order}
        records = [self._record(unit, index, spec, placed[j], by_depth[j], slack) for j in range(len(placed))]
        return records, {"task": unit.task, "length": unit.length, "seed": unit.seed, "item": index,
                         "seconds": seconds, "encoded": cost.encoded, "prompted": cost.prompted,
                         "generated": cost.generated, "prompts": len(prompts)}

    def _record(self, unit: Unit, index: int, spec, placed, texts: list[str], slack: int) -> dict:
        hits = [scoring.correct(spec.kind, t, g) for t, g in zip(texts, spec.golds)]
        return {"task": unit.task, "length": unit.length, "depth": placed.depth, "seed": unit.seed, "item": index,
                "score": float(np.mean(hits)), "tokens": max(map(len, placed.prompts)), "slack": slack,
                "needle_at": placed.needle_at, "depth_actual": placed.depth_actual, "dropped": placed.dropped,
                "needle_lost": placed.needle_lost,
                "gold": [list(g) for g in spec.golds], "extracted": [list(scoring.extract(spec.kind, t)) for t in texts],
                "generated": texts}


def cells(records: list[dict], config, rates: dict[str, tuple[float, float]]) -> list[dict]:
    """One summary per (task, length, depth), in the grid's order; `rates` maps task -> (chance, context_guess)."""
    out = []
    for task in config.tasks:
        for length in config.lengths:
            for depth in config.depths:
                rows = [r for r in records if (r["task"], r["length"], r["depth"]) == (task, length, depth)]
                out.append(_cell(task, length, depth, rows, config.seeds, rates[task]))
    return out


def _cell(task: str, length: int, depth: int, rows: list[dict], seeds, rates: tuple[float, float]) -> dict:
    values = [np.array([r["score"] for r in rows if r["seed"] == s]) for s in seeds]
    ids = [[s * 1_000_000 + r["item"] for r in rows if r["seed"] == s] for s in seeds]
    stats = interval_summary(values, ids)
    tokens = [r["tokens"] for r in rows]
    return {"task": task, "length": length, "depth": depth, "accuracy": stats["mean"], "ci95": stats["ci95"],
            "per_seed": stats["per_seed"], "seed_std": stats["seed_std"], "chance": rates[0],
            "context_guess": rates[1], "tokens": float(np.mean(tokens)), "tokens_range": [min(tokens), max(tokens)],
            "slack_max": max(r["slack"] for r in rows), "depth_actual": float(np.mean([r["depth_actual"] for r in rows])),
            "needle_lost": sum(r["needle_lost"] for r in rows), "items": len(rows) // len(seeds),
            "seeds": len(seeds)}


def cost_rows(costs: list[dict], config) -> list[dict]:
    """Per (task, length): what one item costs, every depth of it together (tokens encoded vs prompted)."""
    out = []
    for task in config.tasks:
        for length in config.lengths:
            rows = [c for c in costs if (c["task"], c["length"]) == (task, length)]
            out.append({"task": task, "length": length, "prompts_per_item": rows[0]["prompts"],
                        "tokens_prompted_per_item": float(np.mean([c["prompted"] for c in rows])),
                        "tokens_encoded_per_item": float(np.mean([c["encoded"] for c in rows])),
                        "tokens_generated_per_item": float(np.mean([c["generated"] for c in rows])),
                        "seconds_per_item": float(np.mean([c["seconds"] for c in rows]))})
    return out
