"""Many-shot instruction tuning data: templates, held-out clusters, packing and loss masks.

EVALM §3.2 concatenates templated instruction examples "until their total length reaches the
limitation of 8192" (MSIT) or 2 x 8192 (MSIT+), with no attention reset, so later examples in a
line see earlier ones as demonstrations. The recipe's details are unknown; this module follows
docs/training.md [recommend]:
- example = tokens(prompt) + tokens(answer) + [eos]; the loss mask covers the answer and its eos
  (metaseq src/tgt: the prompt positions are pad in the target copy), or every token;
- whole examples are packed greedily into lines of exactly seq_len + 1 tokens (metaseq `complete`),
  the rest of a line is eos padding with mask 0; an example longer than a line is dropped or
  right-truncated; `allow_split` instead streams examples across lines (metaseq `none`);
- lines hold one task each by default (many shots of the same task);
- FLAN-style held-out clusters and tasks are removed before anything else (EVALM Appendix B).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from evalm.config_toolkit import ConfigError
from evalm.train.config import MsitDataConfig
from evalm.train.instructions import Example, iter_examples


@dataclass(frozen=True, slots=True)
class Encoded:
    """One templated example: ids (N,) and loss mask (N,) of 0/1, same length."""

    task: str
    ids: np.ndarray
    mask: np.ndarray


def held_out(config: MsitDataConfig) -> set[str]:
    """Tasks that must never appear in tuning data: held-out tasks plus every task of a held-out cluster."""
    return set(config.held_out_tasks).union(*(config.clusters[c] for c in config.held_out_clusters))


def encode_example(example: Example, tokenizer, config: MsitDataConfig) -> Encoded:
    """I(x, y) as ids with its loss mask: 0 on the prompt, 1 on the answer and its eos (or 1 everywhere)."""
    return next(encode_examples([example], tokenizer, config))


def encode_examples(examples: Iterable[Example], tokenizer, config: MsitDataConfig, batch: int = 4096
                    ) -> Iterator[Encoded]:
    """`encode_example` of each, in order, the texts tokenized `batch` at a time (one `encode_batch` call:
    the tokenizers library's loop instead of Python's; 192,296 tuning examples: 2.2 s -> well under 1)."""
    pending: list[Example] = []
    for example in examples:
        pending.append(example)
        if len(pending) == batch:
            yield from _encode(pending, tokenizer, config)
            pending = []
    yield from _encode(pending, tokenizer, config)


def _encode(examples: list[Example], tokenizer, config: MsitDataConfig) -> Iterator[Encoded]:
    if not examples:
        return
    texts = []
    for e in examples:
        prompt, answer = config.templates.get(e.task, config.default_template)
        texts += [prompt.format(input=e.input, output=e.output), answer.format(input=e.input, output=e.output)]
    ids = tokenizer.encode_batch(texts)
    for i, e in enumerate(examples):
        prompt_ids, answer_ids = ids[2 * i], [*ids[2 * i + 1], tokenizer.eos_id]
        whole = np.asarray(prompt_ids + answer_ids, dtype=np.int64)
        mask = np.ones(len(whole), dtype=np.uint8)
        if config.loss_on == "answer":
            mask[: len(prompt_ids)] = 0
        yield Encoded(e.task, whole, mask)


def _groups(encoded: list[Encoded], config: MsitDataConfig) -> list[list[Encoded]]:
    """Examples in packing order: one group per task (sorted by name) or one mixed group, each seeded-shuffled."""
    rng = np.random.default_rng(config.seed)
    if config.group_by_task:
        by_task: dict[str, list[Encoded]] = defaultdict(list)
        for e in encoded:
            by_task[e.task].append(e)
        groups = [by_task[t] for t in sorted(by_task)]
    else:
        groups = [list(encoded)]
    if config.shuffle:
        groups = [[g[i] for i in rng.permutation(len(g))] for g in groups]
    return groups


def pack(encoded: list[Encoded], config: MsitDataConfig, pad_id: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """Lines (L, seq_len + 1) of ids and of loss mask, and counts of what happened to examples."""
    width = config.seq_len + 1
    lines: list[tuple[np.ndarray, np.ndarray]] = []
    stats = {"examples": 0, "dropped_oversize": 0, "truncated": 0, "lines": 0}
    for group in _groups(encoded, config):
        ids_buf: list[np.ndarray] = []
        mask_buf: list[np.ndarray] = []
        used = 0

        def close_line() -> None:
            nonlocal used
            pad = width - used
            lines.append((np.concatenate([*ids_buf, np.full(pad, pad_id, dtype=np.int64)]),
                          np.concatenate([*mask_buf, np.zeros(pad, dtype=np.uint8)])))
            ids_buf.clear(), mask_buf.clear()
            used = 0

        for ex in group:
            ids, mask = ex.ids, ex.mask
            if config.allow_split:  # metaseq `none`: a stream cut into equal lines
                while len(ids):
                    take = min(width - used, len(ids))
                    ids_buf.append(ids[:take]), mask_buf.append(mask[:take])
                    used += take
                    ids, mask = ids[take:], mask[take:]
                    if used == width:
                        close_line()
                stats["examples"] += 1
                continue
            if len(ids) > width:
                if config.oversize == "drop":
                    stats["dropped_oversize"] += 1
                    continue
                ids, mask = ids[:width], mask[:width]
                stats["truncated"] += 1
            if used + len(ids) > width:
                close_line()
            ids_buf.append(ids), mask_buf.append(mask)
            used += len(ids)
            stats["examples"] += 1
        if used:
            close_line()
    if not lines:
        raise ConfigError("no instruction example fits a line: raise data.seq_len or set data.oversize='truncate'")
    stats["lines"] = len(lines)
    ids = np.stack([line for line, _ in lines])
    masks = np.stack([mask for _, mask in lines])
    return ids, masks, stats


class PackedLines:
    """A line source over packed MSIT lines (same interface as `shards.PretrainLines`)."""

    structure = None  # how the trainer feeds the lines (train.structure); None: packed

    def __init__(self, ids: np.ndarray, masks: np.ndarray):
        self.ids, self.masks = ids, masks
        self.seq_len = ids.shape[1] - 1

    def __len__(self) -> int:
        return len(self.ids)

    def line(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.ids[i], self.masks[i]


class MixedLines:
    """MSIT lines with pretraining lines interleaved at a fixed rate (replay against forgetting).

    Tuning only on instruction lines moves the model away from language modelling (EVALM §4.4:
    "the instruction tuning will adapt PLMs from" the LM objective, Figure 4's MSIT curve). Mixing
    a `fraction` of plain pretraining lines (every token a target) into the stream keeps it a
    language model. Line i is a pretraining line when floor((i + 1) f) > floor(i f), so they are
    spread evenly; the mapping is a pure function of i, so resume stays exact.
    """

    def __init__(self, tuning, pretraining, fraction: float):
        if not 0.0 < fraction < 1.0:
            raise ConfigError(f"pretrain_fraction must lie in (0, 1), got {fraction}")
        if pretraining.seq_len != tuning.seq_len:
            raise ValueError("pretraining and tuning lines must have the same seq_len")
        self.tuning, self.pretraining, self.fraction = tuning, pretraining, fraction
        self.seq_len = tuning.seq_len
        n = len(tuning)
        while n - math.floor(n * fraction) < len(tuning):
            n += 1
        self.n_lines = n

    def __len__(self) -> int:
        return self.n_lines

    def line(self, i: int) -> tuple[np.ndarray, np.ndarray | None]:
        before, after = math.floor(i * self.fraction), math.floor((i + 1) * self.fraction)
        if after > before:
            return self.pretraining.line(before % len(self.pretraining))
        return self.tuning.line((i - after) % len(self.tuning))


def build_lines(config: MsitDataConfig, tokenizer, examples: Iterable[Example] | None = None) -> tuple[PackedLines, dict]:
    """Read, hold out, template, encode and pack: the whole MSIT data path in one call.

    Examples stream in and are filtered and encoded one by one, so only token ids are kept, never
    the collection's text (FLAN collections are millions of rows)."""
    examples = iter_examples(config.train_file, config.columns) if examples is None else examples
    excluded = held_out(config)
    removed = 0

    def kept(stream: Iterable[Example]) -> Iterator[Example]:
        nonlocal removed
        for e in stream:
            if e.task in excluded:
                removed += 1
            else:
                yield e

    encoded = list(encode_examples(kept(examples), tokenizer, config))
    ids, masks, stats = pack(encoded, config, tokenizer.eos_id)
    stats |= {"held_out_tasks": sorted(excluded), "removed_held_out": removed,
              "tasks": sorted({e.task for e in encoded})}
    return PackedLines(ids, masks), stats
