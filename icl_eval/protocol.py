"""The many-shot protocol (docs/evaluation.md): methods x shots x seeds on the chosen test items.

Test items are the whole split or a seeded sample recorded by index (`select_items`). For each
seed and shot count, the demonstrations are drawn once (dataset level: the same ordered
list for every test item, so the cache is reused) or per item (Top-k), every method scores every
test item, and the record keeps what was used: demonstrations per item, context tokens, groups,
seconds per item and cache bytes, plus each item's correctness and, once per cell, the label
baselines on the same items and demonstrations (`baselines.py`); `summary.py` turns them into
means, intervals and gains. The synthetic task draws a fresh episode (rule) per seed.

Beside the shot grid: a token-budget grid (`budget.py`: per seed the largest demonstration prefix
that fits), labels spelled per draw seed (`label_map.py`), each draw arranged by order seeds and
in further orders (`order.py`), and per-item nearest-demonstration arms (`nearest.py`). Each record
names its draw `seed`, its `order_seed` and its `arm` ("" for the main order and full context).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np

from evalm.config_toolkit import ConfigError, to_dict
from evalm.icl_eval.baselines import label_baselines
from evalm.icl_eval.budget import fit
from evalm.icl_eval.label_map import remap
from evalm.icl_eval.config import EvalConfig
from evalm.icl_eval.lm import CausalLM
from evalm.icl_eval.methods import METHODS, MethodOptions, MethodResult
from evalm.icl_eval.nearest import Embedder
from evalm.icl_eval.nearest import apply as apply_nearest
from evalm.icl_eval.nearest import nearest
from evalm.icl_eval.order import arrange
from evalm.icl_eval.prompts import Demo, PromptBuilder, TestItem
from evalm.icl_eval.scoring import calibrate, metrics
from evalm.icl_eval.selection import TopK, dataset_level
from evalm.icl_eval.summary import summarize
from evalm.icl_eval.tasks import Task

Splits = dict[str, list[dict[str, Any]]]


def hold_out_validation(splits: Splits, n: int) -> tuple[Splits, list[int]]:
    """Use the validation split if present, else the last `n` training items (excluded from demos)."""
    if splits.get("validation"):
        return splits, []
    train = splits["train"]
    if n >= len(train):
        raise ConfigError(f"cannot hold out {n} validation items from {len(train)} training items")
    held = list(range(len(train) - n, len(train)))
    return {**splits, "validation": [train[i] for i in held]}, held


def select_items(n: int, config: EvalConfig) -> list[int]:
    """Indices of the test items to score: all of them, a seeded random sample, or the first N."""
    if config.test_items is None or config.test_items >= n:
        return list(range(n))
    if config.test_items_order == "first":
        return list(range(config.test_items))
    return sorted(random.Random(config.test_items_seed).sample(range(n), config.test_items))


SUMMED = ("seconds", "encode_seconds", "context_encodings")
"""Per-item info fields that add up over items scored one context each (Top-k)."""
MEANS = ("seconds_per_item", "marginal_seconds_per_item")
PEAKS = ("context_tokens", "cache_bytes")


def aggregate_info(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One cell's info from items scored one context each: times summed, per-item rates averaged,
    sizes at their peak, the demonstrations used per item; other fields as the first item's."""
    info = dict(parts[0])
    info["demos_used"] = [p["demos_used"][0] for p in parts]
    for key in SUMMED:
        if key in info:
            info[key] = float(sum(p[key] for p in parts))
    for key in MEANS:
        if key in info:
            info[key] = float(np.mean([p[key] for p in parts]))
    for key in PEAKS:
        if key in info:
            info[key] = max(p[key] for p in parts)
    return info


class Runner:
    """Scores one task on one model over the protocol grid."""

    def __init__(self, lm: CausalLM, task: Task, config: EvalConfig, options: MethodOptions,
                 splits_for_seed: Callable[[int], Splits], progress=None):
        self.lm, self.task, self.config, self.options = lm, task, config, options
        if not isinstance(getattr(splits_for_seed, "shares_test", None), bool):
            raise TypeError("splits_for_seed must declare whether seeds share the test items: pass a "
                            "task_data.SeedSplits(for_seed, shares_test)")
        self.splits_for_seed, self.progress = splits_for_seed, progress
        self.label_maps: dict[int, dict[str, str]] = {}
        """Per draw seed: the original label -> the label as the prompts spell it (label_map)."""
        self.prompt = self._prompt_for(config.seeds[0])
        self.records: list[dict] = []
        self.baselines: list[dict] = []
        """Per (split, seed, shots): each label baseline's per-item correctness on the items scored."""
        self.predictions: list[dict] = []
        self._item_set = 0
        self._measure: tuple[Any, TopK | Embedder] | None = None
        self._state: dict[str, Any] | None = None

    def run(self) -> list[dict]:
        """Every unit in order, in this process (the sharded path is `icl_eval.units`)."""
        for unit in self.units():
            self.run_unit(unit)
        return self.records

    def units(self) -> list[tuple[int, str, int]]:
        """The grid's units of work, in the one-process order: (draw seed, split, shots or budget).

        A unit shares one demonstration draw and so one cache: every method, order and arm of it runs
        together, and its records do not depend on which other units ran (or on which rank)."""
        parts = ["test"] + (["validation"] if self.config.choose_shot_on_validation else [])
        values = self.config.budgets or self.config.shots
        return [(seed, split, value) for seed in self.config.seeds for split in parts for value in values]

    def run_unit(self, unit: tuple[int, str, int]) -> dict[str, list[dict]]:
        """Score one unit; returns (and appends to this runner's lists) its records, baselines and predictions."""
        seed, split, value = unit
        marks = len(self.records), len(self.baselines), len(self.predictions)
        state = self._split_state(seed, split)
        self.prompt = state["prompt"]
        self._item_set = state["item_set"]
        if self.config.selection == "topk":
            self._run_topk(split, seed, state, value)
        else:
            self._run_value(split, seed, state, value)
        return {"records": self.records[marks[0]:], "baselines": self.baselines[marks[1]:],
                "predictions": self.predictions[marks[2]:]}

    def adopt(self, units: list[dict[str, list[dict]]]) -> None:
        """Take finished units (`run_unit`'s returns, in the order of `units()`, possibly scored elsewhere) as
        if this runner had run them all: their rows in that order, every seed's label map, the last seed's prompt."""
        for part in ("records", "baselines", "predictions"):
            setattr(self, part, [row for unit in units for row in unit[part]])
        for seed in self.config.seeds:
            self.prompt = self._prompt_for(seed)

    def _split_state(self, seed: int, split: str) -> dict[str, Any]:
        """What the units of one (seed, split) share, kept for the next unit of the same pair."""
        if self._state is not None and self._state["key"] == (seed, split):
            return self._state
        raw = self.splits_for_seed(seed)
        # seeds share the items of one split (crossed design), or each has its own (the synthetic
        # family's fresh episode per seed: nested), as the data source declares; recorded so the
        # bootstrap resamples correctly
        item_set = 0 if self.splits_for_seed.shares_test or seed == self.config.seeds[0] else seed
        prompt = self._prompt_for(seed)
        splits, held = hold_out_validation(raw, self.config.validation_items) \
            if self.config.choose_shot_on_validation else (raw, [])
        train = splits["train"]
        indices = select_items(len(splits[split]), self.config)
        demo_cache: dict[tuple[int, int | None], Demo] = {}
        gold_cache: dict[int, int] = {}

        def demo(i: int, label: int | None = None) -> Demo:
            if (i, label) not in demo_cache:
                demo_cache[(i, label)] = prompt.demo(i, train[i], label)
            return demo_cache[(i, label)]

        def gold(i: int) -> int:
            if i not in gold_cache:
                gold_cache[i] = self.task.gold(train[i])
            return gold_cache[i]

        self._state = {"key": (seed, split), "prompt": prompt, "item_set": item_set, "held": held, "train": train,
                       "indices": indices, "rows": [splits[split][i] for i in indices], "demo": demo, "gold": gold,
                       "labels": [gold(i) for i in range(len(train))] if self.config.balanced else None}
        return self._state

    def _prompt_for(self, seed: int) -> PromptBuilder:
        """The prompt builder of one draw seed: the task's labels spelled under its label map."""
        task = remap(self.task, self.config.label_map, seed)
        if task.spelled:
            self.label_maps[seed] = dict(zip(self.task.labels, task.spelled))
        return PromptBuilder(task, self.lm.tokenizer, self.config.separator, self.config.bos)

    def results(self, model: dict, data_info: dict, seconds: float) -> dict[str, Any]:
        """results.json of a finished run: what was run (`protocol`), the summary, every record.

        `model`: icl_eval.loading.describe of the scored model; `data_info`: where the task's rows came from."""
        return {
            "protocol": {"model": model, "task": self.task.name, "template": self.task.template,
                         "template_source": self.task.source, "labels": list(self.task.labels), "data": data_info,
                         "label_tokens": self.prompt.label_token_counts(), "bos": self.prompt.describe_bos(),
                         "eval": to_dict(self.config), "method_options": to_dict(self.options),
                         "scoring": self.options.scoring, "seconds": seconds,
                         "label_map": self.config.label_map, "label_maps": self.label_maps},
            "summary": summarize(self.records, self.baselines),
            "records": self.records,
            "baseline_records": self.baselines,
        }

    def _run_value(self, split: str, seed: int, state: dict[str, Any], value: int) -> None:
        """One dataset-level cell: the draw of `value` shots (or of budget `value`), then `_run_cell`."""
        train, held, labels, indices, rows = (state[k] for k in ("train", "held", "labels", "indices", "rows"))
        demo, gold = state["demo"], state["gold"]
        if self.config.budgets:
            ids, cell = self._budget_draw(train, seed, held, labels, indices, rows, demo, value)
        else:
            ids, cell = dataset_level(len(train), value, seed, exclude=held, labels=labels), {"shots": value}
        items = [self.prompt.test_item(i, r, cell["shots"]) for i, r in zip(indices, rows)]
        self._run_cell(split, seed, cell, ids, items, rows, demo, gold, train)

    def _budget_draw(self, train, seed, held, labels, indices, rows, demo, budget: int) -> tuple[list[int], dict]:
        """The demonstrations of a budget cell: the longest prefix of the seed's order that fits (`budget.fit`)."""
        order = dataset_level(len(train), len(train) - len(set(held)), seed, exclude=held, labels=labels)
        probe = [self.prompt.test_item(i, r, 1) for i, r in zip(indices, rows)]
        longest = max(len(c.tokens) for it in probe for c in it.candidates)
        k, used = fit(self.prompt, order, demo, longest, budget)
        return order[:k], {"shots": k, "budget": budget, "prompt_tokens": used}

    def check_budgets(self) -> None:
        """Raise `budget.BudgetTooSmall` for a budget that fits no demonstration, before any scoring."""
        for seed in self.config.seeds if self.config.budgets else ():
            self.prompt = self._prompt_for(seed)
            raw = self.splits_for_seed(seed)
            splits, held = hold_out_validation(raw, self.config.validation_items) \
                if self.config.choose_shot_on_validation else (raw, [])
            train, indices = splits["train"], select_items(len(splits["test"]), self.config)
            rows = [splits["test"][i] for i in indices]
            labels = [self.task.gold(r) for r in train] if self.config.balanced else None

            def demo(i: int) -> Demo:
                return self.prompt.demo(i, train[i])

            for budget in self.config.budgets:
                ids, _ = self._budget_draw(train, seed, held, labels, indices, rows, demo, budget)
                if budget and self.config.nearest:
                    self._check_nearest(len(ids), f"--budgets {budget} (seed {seed})")
        self.prompt = self._prompt_for(self.config.seeds[0])

    def _run_cell(self, split, seed, cell: dict, ids: list[int], items: list[TestItem], rows, demo, gold, train):
        """One draw: every order (and order seed), then the nearest-demonstration arms, every method."""
        labels = {i: gold(i) for i in ids}
        order_seeds = self.config.order_seeds or (None,)
        zero_shot: dict[str, MethodResult] = {}  # 0 shots: every order is the same empty context
        for o, mode in enumerate(self.config.order):
            arm = "" if o == 0 else mode
            for n, order_seed in enumerate(order_seeds):
                arranged = arrange(ids, labels, mode, order_seed, seed)
                per_item = [[demo(j) for j in arranged]] * len(items)
                if n == 0:
                    self._record_baselines(split, seed, cell, arm, items, [[labels[j] for j in arranged]] * len(items))
                for name in self.config.methods:
                    if not ids and name in zero_shot:
                        result = zero_shot[name]
                        self._tick(len(items))
                    else:
                        result = self._score(name, per_item, items, rows, cell["shots"])
                        zero_shot.setdefault(name, result)
                    self._record(name, split, seed, cell, items, per_item, result, arm=arm, order_seed=order_seed)
        if ids and self.config.nearest:
            self._check_nearest(len(ids), f"{len(ids)} shots")
            sims = self._similarities(train, rows, ids)  # by training id: the same in every order
            for n, order_seed in enumerate(order_seeds):
                # every order of the main arm, so that `vs_base` and the sample learning ratio pair each
                # order's full context with the same order less its nearest (the draw averages both sides)
                main = arrange(ids, labels, self.config.order[0], order_seed, seed)
                self._run_nearest(split, seed, cell, main, sims, items, rows, demo, labels, order_seed, n == 0)

    def _run_nearest(self, split, seed, cell, main: list[int], sims, items, rows, demo, labels, order_seed,
                     first: bool) -> None:
        """Per item, the k demonstrations of `main` most similar to it (`sims`, per test row) removed, kept
        alone or mislabelled; the baselines once per draw (`first`), as the main arm's."""
        k = self.config.nearest_k
        near = [nearest(s, main, k) for s in sims]
        n_labels = self.task.n_candidates()
        for mode in self.config.nearest:
            arm = f"{mode}-nearest"
            contexts, shown = [], []
            for it, close in zip(items, near):
                ctx, over = apply_nearest(mode, main, close, labels, n_labels, random.Random(f"{seed}-{it.item_id}"))
                contexts.append([demo(j, over.get(j)) for j in ctx])
                shown.append([over.get(j, labels[j]) for j in ctx])
            if first:
                self._record_baselines(split, seed, cell, arm, items, shown)
            for name in self.config.methods:
                result = self._score(name, contexts, items, rows, cell["shots"], per_item_context=True)
                self._record(name, split, seed, cell, items, contexts, result, arm=arm, order_seed=order_seed,
                             per_item_ids=True)

    def _check_nearest(self, n_demos: int, where: str) -> None:
        """--nearest-k must leave something to compare: at most the context, and below it for `remove`."""
        k, remove = self.config.nearest_k, "remove" in self.config.nearest
        if k > n_demos or (remove and k == n_demos):
            raise ConfigError(f"--nearest-k {k}: {where} gives {n_demos} demonstrations, "
                              + ("and removing them all leaves none" if k == n_demos else "fewer than that")
                              + f"; lower --nearest-k below {n_demos} or raise the shots/budget")

    def _similarities(self, train, rows, ids: list[int]) -> list:
        """Per test row, its similarity to the training items: TF-IDF over the whole split, or the
        `nearest_embedding` encoder's cosine over the context's `ids`; built once per training split."""
        if self._measure is None or self._measure[0] is not train:
            folder = self.config.nearest_embedding
            measure = Embedder(folder, lambda i: self._text(train[i])) if folder else \
                TopK([self._text(r) for r in train])
            self._measure = (train, measure)
        measure = self._measure[1]
        if isinstance(measure, TopK):
            return [measure.similarities(self._text(r)) for r in rows]
        return [measure.similarities(self._text(r), ids) for r in rows]

    def _run_topk(self, split: str, seed: int, state: dict[str, Any], k: int) -> None:
        """Instance-level Top-k: a different context per item (no reuse across items)."""
        train, held, indices, rows, demo = (state[key] for key in ("train", "held", "indices", "rows", "demo"))
        if "topk" not in state:
            state["topk"] = TopK([self._text(r) for r in train])
        topk = state["topk"]
        items = [self.prompt.test_item(i, r, k) for i, r in zip(indices, rows)]
        per_item = [[demo(j) for j in topk.select(self._text(r), k, exclude=held)] for r in rows]
        demo_labels = [[self.task.gold(train[d.item_id]) for d in demos] for demos in per_item]
        self._record_baselines(split, seed, {"shots": k}, "", items, demo_labels)
        for name in self.config.methods:
            result = self._score(name, per_item, items, rows, k, per_item_context=True)
            self._record(name, split, seed, {"shots": k}, items, per_item, result)

    def _record_baselines(self, split, seed, cell: dict, arm: str, items: list[TestItem],
                          demo_labels: list[list[int]]) -> None:
        """The label baselines of one cell and arm, on the labels its demonstrations showed."""
        vectors = label_baselines([it.gold for it in items], demo_labels, [len(it.candidates) for it in items], seed)
        self.baselines.append({"split": split, "seed": seed, **cell, "arm": arm, "item_set": self._item_set,
                               "item_ids": [it.item_id for it in items],
                               **{name: v.tolist() for name, v in vectors.items()}})

    def _score(self, name: str, per_item: list[list[Demo]], items: list[TestItem], rows, k: int,
               per_item_context: bool = False) -> MethodResult:
        method = METHODS[name]
        if self.config.calibration != "none" and self.task.choice_fields:
            raise ConfigError(f"calibration needs a fixed label space; {self.task.name!r} is multiple choice")
        if per_item_context:  # a different context per item: no reuse across items
            parts = [self._calibrated(method, d, [it], row, k) for d, it, row in zip(per_item, items, rows)]
            return MethodResult([p.scores[0] for p in parts], aggregate_info([p.info for p in parts]))
        return self._calibrated(method, per_item[0], items, rows[0], k)

    def _calibrated(self, method, demos: list[Demo], items: list[TestItem], row, k: int) -> MethodResult:
        """The method's scores after these demonstrations, calibrated against content-free inputs after
        the same demonstrations (so under Top-k each item against its own context)."""
        result = method(self.lm, self.prompt, demos, items, self.options, self._tick)
        if self.config.calibration != "none":
            cf = method(self.lm, self.prompt, demos, self.prompt.content_free_items(row, k), self.options).scores
            result.scores = calibrate(np.array(result.scores), np.array(cf), self.config.calibration).tolist()
        return result

    def _tick(self, n: int) -> None:
        if self.progress is not None:
            self.progress(n)

    def _text(self, row: dict) -> str:
        return " ".join(self.task.fields(row).values())

    def _record(self, name, split, seed, cell: dict, items, per_item, result: MethodResult, arm: str = "",
                order_seed: int | None = None, per_item_ids: bool = False) -> None:
        k = cell["shots"]
        preds = [int(np.argmax(s)) for s in result.scores]
        gold = [it.gold for it in items]
        demos = per_item[0]
        info = {key: v for key, v in result.info.items() if key != "demos_used"}
        used = result.info.get("demos_used", [k] * len(items))
        shared = self.config.selection == "random" and not per_item_ids
        self.records.append({
            "method": name, "split": split, "seed": seed, **cell, "arm": arm, "order_seed": order_seed,
            **metrics(preds, gold),
            "item_set": self._item_set, "item_ids": [it.item_id for it in items], "correct": [int(p == g) for p, g in zip(preds, gold)],
            "demos_used_min": min(used, default=k), "demos_used_mean": float(np.mean(used)) if used else float(k),
            "demo_ids": [d.item_id for d in demos] if shared else None,
            "tokens_per_demo": float(np.mean([len(d.tokens) for d in demos])) if demos else 0.0,
            **({"context_ids": [[d.item_id for d in ds] for ds in per_item]} if per_item_ids else {}),
            **info,
        })
        if self.config.save_predictions:
            for it, s, p in zip(items, result.scores, preds):
                self.predictions.append({"method": name, "split": split, "seed": seed, **cell, "arm": arm,
                                         "order_seed": order_seed, "item": it.item_id,
                                         "gold": it.gold, "prediction": p, "scores": [float(x) for x in s]})
