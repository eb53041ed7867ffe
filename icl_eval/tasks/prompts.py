"""Prompts as token lists (docs/evaluation.md): demonstrations, the context they form, and test candidates.

The layout, the same for every method so that they can be compared exactly:

    context = [bos] d_1 sep d_2 sep ... sep d_k         (k >= 1; empty for 0 shots)
    test(y) = lead I(x, y)        lead = sep when k >= 1, else [bos]

`concat` feeds context + test(y) in one window; `incremental` encodes the context once and feeds
test(y) after a fork; `structured` splits the context into groups, each its own `[bos] d ... d`,
and feeds test(y) after their merge. With one group the token stream is identical to `concat`'s.

[bos] is the model's own (`resolve_bos`): for EVALM the end-of-document `</s>` (documents are
separated by it in pretraining, docs/training.md); for a Hugging Face model what its tokenizer says
(`icl_eval.models.hf.HFTokenizerAdapter.default_bos`: Llama's `<s>`, SmolLM2-Instruct's `<|im_start|>`,
nothing for GPT-2); `none` or a token spelled out overrides it (`--bos`). With no bos, a 0-shot
test's first token has no prediction and is not scored.

Each instance is tokenized in segments split at the `{label}` slot, so the answer's tokens are known
exactly (a space before the slot goes with the answer, as GPT-style BPE merges it that way).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evalm.config_toolkit import ConfigError
from evalm.icl_eval.tasks.task import Task, split_at_label

SEPARATORS: dict[str, str | None] = {
    "newline": "\n",
    "eos": None,  # the end-of-document token (fairseq LMOps variant)
    "space-newline": " \n ",  # LMOps' BLOOM variant
    "blank-line": "\n\n",  # HELMET's ICL prompts: demonstrations separated by an empty line
}

CONTENT_FREE = ("N/A", "", "[MASK]")  # Zhao et al. 2021's content-free inputs


@dataclass(frozen=True)
class Candidate:
    """One test sequence lead + I(x, y) with the spans that scoring reads."""

    tokens: tuple[int, ...]
    body_start: int
    """Index of the first token of I(x, y) (after the lead)."""
    answer_start: int
    answer_end: int
    """The answer y occupies tokens[answer_start:answer_end]."""


@dataclass(frozen=True)
class TestItem:
    """A test input with every candidate rendered, and its gold index (-1 when unknown)."""

    item_id: int
    candidates: tuple[Candidate, ...]
    gold: int


@dataclass(frozen=True)
class Demo:
    """One demonstration I(x_i, y_i): its id in the training split and its tokens."""

    item_id: int
    tokens: tuple[int, ...]
    answer_start: int = 0
    answer_end: int = 0
    """The answer y occupies tokens[answer_start:answer_end] (the loss target of `methods.finetune`)."""


def resolve_bos(tokenizer, spec: str = "auto") -> tuple[tuple[int, ...], str]:
    """The tokens a prompt starts with and why: `auto` (the model's own), `none`, `eos`, or one token's spelling."""
    if spec == "none":
        return (), "none (--bos none)"
    if spec == "eos":
        return (tokenizer.eos_id,), "the eos token (--bos eos)"
    if spec == "auto":
        own = getattr(tokenizer, "default_bos", None)
        if own is None:
            return (tokenizer.eos_id,), "the end-of-document token (EVALM's </s>, docs/training.md)"
        return own()
    lookup = getattr(tokenizer, "token_id", None)
    found = lookup(spec) if lookup else None
    if found is None:
        ids = tokenizer.encode(spec)
        found = ids[0] if len(ids) == 1 else None
    if found is None:
        raise ConfigError(f"--bos {spec!r}: not one token of the tokenizer; use auto, none, eos or a single token")
    return (int(found),), f"{spec!r} (--bos)"


class PromptBuilder:
    """Renders a task's items with one tokenizer, one separator and one BOS."""

    def __init__(self, task: Task, tokenizer, separator: str = "newline", bos: str = "auto"):
        if separator not in SEPARATORS:
            raise ConfigError(f"separator {separator!r} is not known; valid: {sorted(SEPARATORS)}")
        self.task, self.tokenizer, self.separator_name = task, tokenizer, separator
        text = SEPARATORS[separator]
        self.sep: tuple[int, ...] = (tokenizer.eos_id,) if text is None else tuple(tokenizer.encode(text))
        self.bos, self.bos_source = resolve_bos(tokenizer, bos)
        self.instruction: tuple[int, ...] = tuple(tokenizer.encode(task.instruction)) + self.sep if task.instruction else ()

    def segments(self, fields: dict[str, str], answer: str) -> tuple[list[int], list[int], list[int]]:
        """Tokens of the text before the label slot, of the answer, and after it."""
        before, after = split_at_label(self.task.template)
        before_text, after_text = before.format(**fields), after.format(**fields)
        if before_text.endswith(" "):
            before_text, answer = before_text[:-1], " " + answer
        enc = self.tokenizer.encode
        return (enc(before_text) if before_text else []), enc(answer), (enc(after_text) if after_text else [])

    def instance(self, fields: dict[str, str], answer: str) -> tuple[list[int], int, int]:
        """Tokens of I(x, y) and the answer's [start, end) inside them."""
        pre, ans, post = self.segments(fields, answer)
        return pre + ans + post, len(pre), len(pre) + len(ans)

    def demo(self, item_id: int, item: dict[str, Any], label: int | None = None) -> Demo:
        """I(x_i, y_i) with the item's gold label, or with `label` instead (a corrupted demonstration)."""
        shown = self.task.gold(item) if label is None else label
        tokens, a0, a1 = self.instance(self.task.fields(item), self.task.candidates(item)[shown])
        return Demo(item_id, tuple(tokens), a0, a1)

    def test_item(self, item_id: int, item: dict[str, Any], n_shots: int, gold: int | None = None) -> TestItem:
        fields = self.task.fields(item)
        lead = self.lead(n_shots)
        candidates = []
        for answer in self.task.candidates(item):
            body, a0, a1 = self.instance(fields, answer)
            n = len(lead)
            candidates.append(Candidate(tuple(lead) + tuple(body), n, n + a0, n + a1))
        if gold is None:
            gold = self.task.gold(item) if self.task.label_field in item else -1
        return TestItem(item_id, tuple(candidates), gold)

    def content_free_items(self, item: dict[str, Any], n_shots: int, inputs=CONTENT_FREE) -> list[TestItem]:
        """The item's candidates after content-free inputs (every input field set to one of `inputs`)."""
        out = []
        for j, text in enumerate(inputs):
            blank = {name: text for name in self.task.input_fields}
            blank.update({f: item[f] for f in self.task.choice_fields})
            out.append(self.test_item(-1 - j, blank, n_shots, gold=-1))
        return out

    def describe_bos(self) -> dict[str, Any]:
        """What results.json records about the BOS."""
        return {"ids": list(self.bos), "text": self.tokenizer.decode(list(self.bos)) if self.bos else "",
                "source": self.bos_source}

    def label_token_counts(self) -> dict[str, int]:
        """Tokens of each verbalized label inside the template (empty for multiple choice).

        Summed scores (instance-sum, answer-sum) of labels with unequal token counts are biased
        towards the shorter ones: a small BPE can make " A" one token and " B" two."""
        fields = {name: "x" for name in self.task.input_fields}
        return {label: len(self.segments(fields, label)[1]) for label in (self.task.spelled or self.task.labels)}

    def lead(self, n_shots: int) -> tuple[int, ...]:
        return self.sep if n_shots > 0 else self.bos

    def context(self, demos: list[Demo]) -> list[int]:
        """[bos] (instruction) d_1 sep ... sep d_k, or [] for no demonstrations."""
        if not demos:
            return []
        out = list(self.bos) + list(self.instruction)
        for i, d in enumerate(demos):
            if i:
                out.extend(self.sep)
            out.extend(d.tokens)
        return out
