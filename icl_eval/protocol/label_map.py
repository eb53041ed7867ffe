"""Label remapping: the verbalizer replaced per demonstration draw, so a model cannot answer from its priors.

Modes (`[eval] label_map`, `--label-map`):
- `none`: the task's own words;
- `int`: label i is spelled `str(perm[i])` for a seeded shuffle `perm` of 0..n-1 (HELMET's ICL
  protocol: labels mapped to shuffled integers);
- `symbols`: label i is spelled by an abstract symbol (`SYMBOLS`, then pairs of them past 16 labels),
  assigned by a seeded shuffle;
- `flip`: label i is spelled with another label's word, a seeded derangement (Sattolo's algorithm:
  one cycle, no fixed point); with two labels it is the swap of Wei et al. 2023's flipped-label ICL.

The gold index of an item never changes: label i is spelled `words[i]` in the demonstrations and
among the test candidates alike. So scoring, predictions and the three label baselines (chance,
test-set majority, in-context majority), which all work on label indices, work on the mapped labels
by construction, and a model is right when it picks the mapped word of the gold label, i.e. follows
the mapping the context teaches. With `int` or `symbols`, 0 shots can only guess: any rise over the
baselines with shots is learned in context. With `flip`, accuracy is agreement with the flipped
labels (a model answering from its priors scores below chance on two labels).
Each draw seed has its own mapping (`random.Random("label-map-<seed>")`), recorded in results.json.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

from evalm.config_toolkit import ConfigError
from evalm.icl_eval.tasks.task import Task

MODES = ("none", "int", "symbols", "flip")

SYMBOLS = ("@", "#", "$", "%", "&", "*", "+", "=", "~", "^", "<", ">", "|", "?", "!", ";")
"""Single-character symbols with no label meaning; pairs of them name labels past the sixteenth."""


def symbols(n: int) -> list[str]:
    """n distinct abstract symbols: the singles, then ordered pairs."""
    pairs = ("".join(p) for p in itertools.product(SYMBOLS, repeat=2))
    return list(itertools.islice(itertools.chain(SYMBOLS, pairs), n))


def mapped_words(words: tuple[str, ...], mode: str, seed: int) -> tuple[str, ...]:
    """The spelling of each label index under `mode` for the draw `seed`."""
    if mode not in MODES:
        raise ConfigError(f"label map {mode!r} is not known; valid: {', '.join(MODES)}")
    n = len(words)
    rng = random.Random(f"label-map-{seed}")
    if mode == "none":
        return tuple(words)
    if mode == "int":
        perm = list(range(n))
        rng.shuffle(perm)
        return tuple(str(p) for p in perm)
    if mode == "symbols":
        chosen = symbols(n)
        rng.shuffle(chosen)
        return tuple(chosen)
    cycle = list(range(n))  # flip: Sattolo's algorithm draws a uniform n-cycle, so no label keeps its word
    for i in range(n - 1, 0, -1):
        j = rng.randrange(i)
        cycle[i], cycle[j] = cycle[j], cycle[i]
    return tuple(words[cycle[i]] for i in range(n))


def remap(task: Task, mode: str, seed: int) -> Task:
    """The task with its verbalizer spelled under `mode` for the draw `seed` (`none`: the task itself)."""
    if mode == "none":
        return task
    if task.choice_fields:
        raise ConfigError(f"--label-map {mode}: task {task.name!r} is multiple choice (its answers are item texts, "
                          "not a label set), so there is no label to remap; use --label-map none")
    return dataclasses.replace(task, spelled=mapped_words(task.labels, mode, seed))
