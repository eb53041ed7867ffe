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
from typing import Any

import numpy as np

from evalm.config_toolkit import ConfigError, to_dict
from evalm.icl_eval.stats.baselines import label_baselines
from evalm.icl_eval.protocol.budget import fit
from evalm.icl_eval.protocol.cells import Arm, Cell, SplitState, hold_out_validation, select_items
from evalm.icl_eval.protocol.label_map import remap
from evalm.icl_eval.config import EvalConfig
from evalm.icl_eval.models.lm import CausalLM
from evalm.icl_eval.methods.decoder import METHODS, MethodOptions, MethodResult
from evalm.icl_eval.methods.finetune import check_can_finetune
from evalm.icl_eval.protocol.nearest import Embedder
from evalm.icl_eval.protocol.nearest import apply as apply_nearest
from evalm.icl_eval.protocol.nearest import nearest
from evalm.icl_eval.protocol.order import arrange
from evalm.icl_eval.tasks.prompts import Demo, PromptBuilder, TestItem
from evalm.icl_eval.methods.scoring import calibrate, metrics
from evalm.icl_eval.protocol.selection import TopK, dataset_level
from evalm.icl_eval.stats.summary import summarize
from evalm.icl_eval.tasks.data import SeedSplits
from evalm.icl_eval.tasks.task import Task

SUMMED = ("seconds", "encode_seconds", "context_encodings")
"""Per-item info fields that add up over items scored one context each (Top-k)."""
MEANS = ("seconds_per_item", "marginal_seconds_per_item")
PEAKS = ("context_tokens", "cache_bytes")
ONCE_PER_DRAW = ("finetune",)
"""Methods that learn from the draw's demonstrations as a set (`methods.finetune` trains on them in its own
seeded order): scored once per draw, in the main order's cell, not again per order, order seed or
nearest-demonstration arm, whose contexts differ only in how the same demonstrations are shown."""


def check_once_per_draw(config: EvalConfig) -> None:
    """A once-per-draw method needs one dataset-level draw per cell and no calibration (which would train
    a second copy on content-free inputs): one line naming both ways out."""
    names = [m for m in config.methods if m in ONCE_PER_DRAW]
    if names and config.selection != "random":
        raise ConfigError(f"--methods {names[0]} trains on one draw per cell, but selection = topk gives every test "
                          "item its own demonstrations; use --eval.selection=random or drop it from --methods")
    if names and config.calibration != "none":
        raise ConfigError(f"--methods {names[0]} scores a fine-tuned copy with 0 shots, which calibration "
                          f"{config.calibration!r} does not apply to; set --eval.calibration=none or drop it")


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
    """Scores one task on one model over the protocol grid. Its lists `records`, `baselines` and
    `predictions` are what it produced; everything a unit reads is passed to it as a `SplitState` and
    a `Cell`, so no unit depends on what ran before it."""

    def __init__(self, lm: CausalLM, task: Task, config: EvalConfig, options: MethodOptions,
                 splits_for_seed: SeedSplits, progress=None):
        self.lm, self.task, self.config, self.options = lm, task, config, options
        if not isinstance(splits_for_seed, SeedSplits):
            raise TypeError("splits_for_seed must declare whether seeds share the test items: pass a "
                            "task_data.SeedSplits(for_seed, shares_test)")
        self.splits_for_seed, self.progress = splits_for_seed, progress
        check_once_per_draw(config)
        if any(m in ONCE_PER_DRAW for m in config.methods):
            check_can_finetune(lm, options.finetune)
        self.records: list[dict] = []
        self.baselines: list[dict] = []
        """Per (split, seed, shots): each label baseline's per-item correctness on the items scored."""
        self.predictions: list[dict] = []
        # memos of pure functions of their keys (a prompt per seed, the last split state, similarity
        # measures per training split): they save work and hold no state a result depends on
        self._prompts: dict[int, PromptBuilder] = {}
        self._state: SplitState | None = None
        self._measure: tuple[Any, TopK | Embedder] | None = None
        self._topk: tuple[SplitState, TopK] | None = None

    def run(self) -> list[dict]:
        """Every unit in order, in this process (the sharded path is `icl_eval.protocol.units`)."""
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
        if self.config.selection == "topk":
            self._run_topk(state, value)
        else:
            self._run_value(state, value)
        return {"records": self.records[marks[0]:], "baselines": self.baselines[marks[1]:],
                "predictions": self.predictions[marks[2]:]}

    def adopt(self, units: list[dict[str, list[dict]]]) -> None:
        """Take finished units (`run_unit`'s returns, in the order of `units()`, possibly scored elsewhere) as
        if this runner had run them all: their rows in that order."""
        for part in ("records", "baselines", "predictions"):
            setattr(self, part, [row for unit in units for row in unit[part]])

    def prompt_for(self, seed: int) -> PromptBuilder:
        """The prompt builder of one draw seed: the task's labels spelled under its label map."""
        if seed not in self._prompts:
            self._prompts[seed] = PromptBuilder(remap(self.task, self.config.label_map, seed), self.lm.tokenizer,
                                                self.config.separator, self.config.bos)
        return self._prompts[seed]

    @property
    def label_maps(self) -> dict[int, dict[str, str]]:
        """Per draw seed: the original label -> the label as the prompts spell it (`label_map`); empty
        without a label map."""
        spelled = {seed: self.prompt_for(seed).task.spelled for seed in self.config.seeds}
        return {seed: dict(zip(self.task.labels, words)) for seed, words in spelled.items() if words}

    def _split_state(self, seed: int, split: str) -> SplitState:
        """What the units of one (seed, split) share, kept for the next unit of the same pair."""
        if self._state is not None and (self._state.seed, self._state.split) == (seed, split):
            return self._state
        raw = self.splits_for_seed(seed)
        splits, held = hold_out_validation(raw, self.config.validation_items) \
            if self.config.choose_shot_on_validation else (raw, [])
        indices = select_items(len(splits[split]), self.config)
        item_set = 0 if self.splits_for_seed.shares_test or seed == self.config.seeds[0] else seed
        train = splits["train"]
        labels = [self.task.gold(row) for row in train] if self.config.balanced else None
        self._state = SplitState(seed, split, self.task, self.prompt_for(seed), item_set, held, train, indices,
                                 [splits[split][i] for i in indices], labels)
        return self._state

    def results(self, model: dict, data_info: dict, seconds: float) -> dict[str, Any]:
        """results.json of a finished run: what was run (`protocol`), the summary, every record.

        `model`: icl_eval.models.loading.describe of the scored model; `data_info`: where the task's rows came
        from. Label tokens and bos are the last seed's prompt's (they differ between seeds only in the
        label spellings, which `label_maps` gives for every seed)."""
        prompt = self.prompt_for(self.config.seeds[-1])
        return {
            "protocol": {"model": model, "task": self.task.name, "template": self.task.template,
                         "template_source": self.task.source, "labels": list(self.task.labels), "data": data_info,
                         "label_tokens": prompt.label_token_counts(), "bos": prompt.describe_bos(),
                         "eval": to_dict(self.config), "method_options": to_dict(self.options),
                         "scoring": self.options.scoring, "seconds": seconds,
                         "label_map": self.config.label_map, "label_maps": self.label_maps},
            "summary": summarize(self.records, self.baselines),
            "records": self.records,
            "baseline_records": self.baselines,
        }

    def _run_value(self, state: SplitState, value: int) -> None:
        """One dataset-level cell: the draw of `value` shots (or of budget `value`), then `_run_cell`."""
        if self.config.budgets:
            ids, fields = self._budget_draw(state, value)
        else:
            ids = dataset_level(len(state.train), value, state.seed, exclude=state.held, labels=state.labels)
            fields = {"shots": value}
        items = [state.prompt.test_item(i, r, fields["shots"]) for i, r in zip(state.indices, state.rows)]
        self._run_cell(Cell(state, fields, items), ids)

    def _budget_draw(self, state: SplitState, budget: int) -> tuple[list[int], dict[str, int]]:
        """The demonstrations of a budget cell: the longest prefix of the seed's order that fits (`budget.fit`)."""
        train, held = state.train, state.held
        order = dataset_level(len(train), len(train) - len(set(held)), state.seed, exclude=held, labels=state.labels)
        probe = [state.prompt.test_item(i, r, 1) for i, r in zip(state.indices, state.rows)]
        longest = max(len(c.tokens) for it in probe for c in it.candidates)
        k, used = fit(state.prompt, order, state.demo, longest, budget)
        return order[:k], {"shots": k, "budget": budget, "prompt_tokens": used}

    def check_budgets(self) -> None:
        """Raise `budget.BudgetTooSmall` for a budget that fits no demonstration, before any scoring."""
        for seed in self.config.seeds if self.config.budgets else ():
            state = self._split_state(seed, "test")
            for budget in self.config.budgets:
                ids, _ = self._budget_draw(state, budget)
                if budget and self.config.nearest:
                    self._check_nearest(len(ids), f"--budgets {budget} (seed {seed})")

    def _run_cell(self, cell: Cell, ids: list[int]) -> None:
        """One draw: every order (and order seed), then the nearest-demonstration arms, every method."""
        state = cell.state
        labels = {i: state.gold(i) for i in ids}
        order_seeds = self.config.order_seeds or (None,)
        zero_shot: dict[str, MethodResult] = {}  # 0 shots: every order is the same empty context
        for o, mode in enumerate(self.config.order):
            for n, order_seed in enumerate(order_seeds):
                arm = Arm("" if o == 0 else mode, order_seed)
                arranged = arrange(ids, labels, mode, order_seed, state.seed)
                per_item = [[state.demo(j) for j in arranged]] * len(cell.items)
                if n == 0:
                    self._record_baselines(cell, arm.name, [[labels[j] for j in arranged]] * len(cell.items))
                for name in self.config.methods:
                    if (o or n) and name in ONCE_PER_DRAW:
                        continue
                    if not ids and name in zero_shot:
                        result = zero_shot[name]
                        self._tick(len(cell.items))
                    else:
                        result = self._score(name, cell, per_item)
                        zero_shot.setdefault(name, result)
                    self._record(name, cell, per_item, result, arm)
        if ids and self.config.nearest:
            self._check_nearest(len(ids), f"{len(ids)} shots")
            sims = self._similarities(state.train, state.rows, ids)  # by training id: the same in every order
            for n, order_seed in enumerate(order_seeds):
                # every order of the main arm, so that `vs_base` and the sample learning ratio pair each
                # order's full context with the same order less its nearest (the draw averages both sides)
                main = arrange(ids, labels, self.config.order[0], order_seed, state.seed)
                self._run_nearest(cell, main, sims, labels, order_seed, first=n == 0)

    def _run_nearest(self, cell: Cell, main: list[int], sims, labels: dict[int, int], order_seed: int | None,
                     first: bool) -> None:
        """Per item, the k demonstrations of `main` most similar to it (`sims`, per test row) removed, kept
        alone or mislabelled; the baselines once per draw (`first`), as the main arm's."""
        state, k = cell.state, self.config.nearest_k
        near = [nearest(s, main, k) for s in sims]
        n_labels = self.task.n_candidates()
        for mode in self.config.nearest:
            arm = Arm(f"{mode}-nearest", order_seed, per_item_ids=True)
            contexts, shown = [], []
            for it, close in zip(cell.items, near):
                rng = random.Random(f"{state.seed}-{it.item_id}")
                ctx, over = apply_nearest(mode, main, close, labels, n_labels, rng)
                contexts.append([state.demo(j, over.get(j)) for j in ctx])
                shown.append([over.get(j, labels[j]) for j in ctx])
            if first:
                self._record_baselines(cell, arm.name, shown)
            for name in (m for m in self.config.methods if m not in ONCE_PER_DRAW):
                result = self._score(name, cell, contexts, per_item_context=True)
                self._record(name, cell, contexts, result, arm)

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

    def _run_topk(self, state: SplitState, k: int) -> None:
        """Instance-level Top-k: a different context per item (no reuse across items)."""
        if self._topk is None or self._topk[0] is not state:
            self._topk = (state, TopK([self._text(r) for r in state.train]))
        topk = self._topk[1]
        cell = Cell(state, {"shots": k}, [state.prompt.test_item(i, r, k) for i, r in zip(state.indices, state.rows)])
        per_item = [[state.demo(j) for j in topk.select(self._text(r), k, exclude=state.held)] for r in state.rows]
        demo_labels = [[self.task.gold(state.train[d.item_id]) for d in demos] for demos in per_item]
        self._record_baselines(cell, "", demo_labels)
        for name in self.config.methods:
            result = self._score(name, cell, per_item, per_item_context=True)
            self._record(name, cell, per_item, result, Arm())

    def _record_baselines(self, cell: Cell, arm: str, demo_labels: list[list[int]]) -> None:
        """The label baselines of one cell and arm, on the labels its demonstrations showed."""
        items, state = cell.items, cell.state
        vectors = label_baselines([it.gold for it in items], demo_labels, [len(it.candidates) for it in items],
                                  state.seed)
        self.baselines.append({"split": state.split, "seed": state.seed, **cell.fields, "arm": arm,
                               "item_set": state.item_set, "item_ids": [it.item_id for it in items],
                               **{name: v.tolist() for name, v in vectors.items()}})

    def _score(self, name: str, cell: Cell, per_item: list[list[Demo]], per_item_context: bool = False) -> MethodResult:
        method = METHODS[name]
        if self.config.calibration != "none" and self.task.choice_fields:
            raise ConfigError(f"calibration needs a fixed label space; {self.task.name!r} is multiple choice")
        if per_item_context:  # a different context per item: no reuse across items
            parts = [self._calibrated(method, cell, demos, [it], row)
                     for demos, it, row in zip(per_item, cell.items, cell.state.rows)]
            return MethodResult([p.scores[0] for p in parts], aggregate_info([p.info for p in parts]))
        return self._calibrated(method, cell, per_item[0], cell.items, cell.state.rows[0])

    def _calibrated(self, method, cell: Cell, demos: list[Demo], items: list[TestItem], row) -> MethodResult:
        """The method's scores after these demonstrations, calibrated against content-free inputs after
        the same demonstrations (so under Top-k each item against its own context)."""
        prompt = cell.state.prompt
        result = method(self.lm, prompt, demos, items, self.options, self._tick)
        if self.config.calibration != "none":
            cf = method(self.lm, prompt, demos, prompt.content_free_items(row, cell.shots), self.options).scores
            result.scores = calibrate(np.array(result.scores), np.array(cf), self.config.calibration).tolist()
        return result

    def _tick(self, n: int) -> None:
        if self.progress is not None:
            self.progress(n)

    def _text(self, row: dict) -> str:
        return " ".join(self.task.fields(row).values())

    def _record(self, name: str, cell: Cell, per_item: list[list[Demo]], result: MethodResult, arm: Arm) -> None:
        k, items, state = cell.shots, cell.items, cell.state
        preds = [int(np.argmax(s)) for s in result.scores]
        gold = [it.gold for it in items]
        demos = per_item[0]
        info = {key: v for key, v in result.info.items() if key != "demos_used"}
        used = result.info.get("demos_used", [k] * len(items))
        shared = self.config.selection == "random" and not arm.per_item_ids
        where = {"split": state.split, "seed": state.seed, **cell.fields, "arm": arm.name, "order_seed": arm.order_seed}
        self.records.append({
            "method": name, **where,
            **metrics(preds, gold),
            "item_set": state.item_set, "item_ids": [it.item_id for it in items],
            "correct": [int(p == g) for p, g in zip(preds, gold)],
            "demos_used_min": min(used, default=k), "demos_used_mean": float(np.mean(used)) if used else float(k),
            "demo_ids": [d.item_id for d in demos] if shared else None,
            "tokens_per_demo": float(np.mean([len(d.tokens) for d in demos])) if demos else 0.0,
            **({"context_ids": [[d.item_id for d in ds] for ds in per_item]} if arm.per_item_ids else {}),
            **info,
        })
        if self.config.save_predictions:
            for it, s, p in zip(items, result.scores, preds):
                self.predictions.append({"method": name, **where, "item": it.item_id,
                                         "gold": it.gold, "prediction": p, "scores": [float(x) for x in s]})
