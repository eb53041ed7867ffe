"""Fine-tuning on the demonstrations, then 0 shots: the in-context methods' counterpart (docs/evaluation.md).

    finetune(lm, prompt, demos, items, options, progress) -> MethodResult

The same signature as every ICL method (`icl_eval.methods.decoder.METHODS`), so the protocol hands it
exactly what it hands `incremental`: the draw's demonstrations, spelled under the draw's label map by
the draw's prompt builder, and the cell's test items. A copy of the model is trained on those
demonstrations alone, each laid out as a 0-shot test item is, `[bos] I(x_i, y_i)`, with the loss on
the answer's tokens only (the template is the loss target; Mosbach et al. 2023's pattern-based
fine-tuning); then every item is scored on the copy with 0 shots, by the one candidate scorer
(`item_scoring.SCORERS`) and the run's scoring rule. The model the other methods score is never
touched; 0 demonstrations scores it as it is (the 0-shot cell).

[schedule note] The schedule is fixed (`SCHEDULE`, printed by `evalm eval icl --help`) so that every N
is trained alike and nothing is tuned on the test items: AdamW, linear warm-up over the first 10% of
the steps then linear decay to 0, gradients clipped at 1.0, no weight decay; batches of min(8, N)
demonstrations, an epoch a fresh seeded permutation; steps = max(MIN_STEPS, ceil(EPOCHS x N / batch)),
so that a handful of demonstrations still gets enough updates to move the model. Full fine-tuning
trains every weight in float32 (bfloat16 matmuls under autocast when the model is scored in
bfloat16), LoRA (`--eval.method.finetune=lora`, the `peft` extra) rank-8 adapters on every linear
layer but the output head, merged into the copy afterwards. The steps go through the project's one
training step (`train.local.train_in_process`: `train.loop.train_step`, `train.schedule.lr_of`).
Deterministic for a draw seed on one thread count: the permutations are seeded by the draw's
demonstrations, torch's generator by the same seed (LoRA's init).
"""

from __future__ import annotations

import copy
import math
import random
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from evalm.config_toolkit import ConfigError, MissingExtra
from evalm.icl_eval.methods.item_scoring import SCORERS
from evalm.icl_eval.methods.options import MethodOptions, MethodResult, Progress
from evalm.icl_eval.tasks.prompts import Candidate, Demo, PromptBuilder, TestItem

IGNORE = -100
"""The trainer's no-loss target (`train.data.IGNORE`)."""


@dataclass(frozen=True)
class Schedule:
    """The fixed fine-tuning schedule of one mode ([schedule note])."""

    lr: float
    batch: int = 8
    epochs: int = 2
    min_steps: int = 12
    warmup_fraction: float = 0.1
    clip_norm: float = 1.0
    lora_rank: int = 8
    lora_alpha: int = 16

    def steps(self, n: int) -> int:
        return max(self.min_steps, math.ceil(self.epochs * n / self.batch_size(n)))

    def batch_size(self, n: int) -> int:
        return min(self.batch, n)

    def describe(self, mode: str) -> str:
        rank = f", rank {self.lora_rank} alpha {self.lora_alpha} adapters" if mode == "lora" else ""
        return (f"{mode}: AdamW lr {self.lr:g}{rank}, batch min({self.batch}, N), "
                f"max({self.min_steps}, ceil({self.epochs} N / batch)) steps, {self.warmup_fraction:.0%} warm-up "
                f"then linear decay to 0, clip {self.clip_norm:g}, no weight decay")


SCHEDULE: dict[str, Schedule] = {"full": Schedule(lr=5e-5), "lora": Schedule(lr=2e-4)}
"""Full fine-tuning at 5e-5 (Mosbach et al. 2023 train OPT at 1e-5 for 40 epochs of batch 32; two shared
CPU cores afford 2 epochs of a 135M model at N = 256, so the rate is raised); LoRA at the 2e-4 of
Mosbach et al.'s LoRA runs."""


def schedule_help() -> str:
    """The schedule as `--help` states it."""
    return "; ".join(s.describe(mode) for mode, s in SCHEDULE.items())


def training_rows(prompt: PromptBuilder, demos: Sequence[Demo]) -> list[tuple[list[int], list[int]]]:
    """Per demonstration: its 0-shot layout `[bos] I(x, y)` up to the answer's end, and the targets of
    each position (the next token where it is an answer token, else IGNORE)."""
    rows = []
    for d in demos:
        if d.answer_end <= d.answer_start:
            raise ValueError(f"demonstration {d.item_id} has no answer span")
        lead = len(prompt.bos)
        tokens = list(prompt.bos) + list(d.tokens[: d.answer_end])
        answer = range(lead + d.answer_start, lead + d.answer_end)
        rows.append((tokens, [tokens[t + 1] if t + 1 in answer else IGNORE for t in range(len(tokens))]))
    return rows


class DemoBatches:
    """The trainer's `next_batch()` over the demonstrations: seeded permutations, one per epoch, cut into
    batches (an epoch's tail continues into the next permutation). `served` counts each id handed out."""

    def __init__(self, demos: Sequence[Demo], rows: list[tuple[list[int], list[int]]], batch: int, seed: int,
                 pad_id: int):
        self.ids, self.rows, self.batch, self.pad_id = [d.item_id for d in demos], rows, batch, pad_id
        self.rng = random.Random(seed)
        self.queue: list[int] = []
        self.served: dict[int, int] = {}
        self.tokens = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        while len(self.queue) < self.batch:
            order = list(range(len(self.rows)))
            self.rng.shuffle(order)
            self.queue += order
        picked, self.queue = self.queue[: self.batch], self.queue[self.batch:]
        width = max(len(self.rows[i][0]) for i in picked)
        inputs = torch.full((len(picked), width), self.pad_id, dtype=torch.long)
        targets = torch.full((len(picked), width), IGNORE, dtype=torch.long)
        for row, i in enumerate(picked):
            tokens, target = self.rows[i]
            inputs[row, : len(tokens)] = torch.tensor(tokens)
            targets[row, : len(target)] = torch.tensor(target)
            self.served[self.ids[i]] = self.served.get(self.ids[i], 0) + 1
            self.tokens += len(tokens)
        return inputs, targets


class Logits(torch.nn.Module):
    """`model(tokens) -> logits` for the trainer's step, whatever the model: an EvalmModel returns its
    logits; a transformers model is called with explicit positions, as `HFCausalLM.forward` calls it."""

    def __init__(self, model: torch.nn.Module, autocast: torch.dtype | None):
        super().__init__()
        self.model, self.autocast = model, autocast
        self.hf = hasattr(model, "get_output_embeddings")

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        where = torch.autocast(tokens.device.type, dtype=self.autocast) if self.autocast else nullcontext()
        with where:
            if not self.hf:
                return self.model(tokens)
            positions = torch.arange(tokens.shape[1], device=tokens.device).expand_as(tokens)
            return self.model(input_ids=tokens, position_ids=positions, use_cache=False).logits


def trainable(lm) -> torch.nn.Module:
    """The torch module under `lm`, refused in one line when it cannot be fine-tuned here."""
    model = getattr(lm, "model", None)
    name = getattr(lm, "name", type(lm).__name__)
    if getattr(lm, "encoder_decoder", False) or not isinstance(model, torch.nn.Module):
        raise ConfigError(f"--methods finetune: {name} is not a decoder-only torch model (an EVALM checkpoint or a "
                          "Hugging Face causal LM); drop finetune from --methods for this model")
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else getattr(model, "lm_head", None)
    weight = getattr(head, "weight", None)
    if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
        raise ConfigError(f"--methods finetune: {name} has no trainable output head (no floating-point LM head "
                          "weight: a model without a language-model head, or quantized weights); load it with its "
                          "LM head in float32 or bfloat16, or drop finetune from --methods")
    return model


def check_can_finetune(lm, mode: str) -> None:
    """Before any scoring (the protocol calls it when `finetune` is in --methods): the one-line refusals of
    a model that cannot be fine-tuned here and of LoRA without `peft`, not after the ICL methods' work."""
    trainable(lm)
    if mode == "lora":
        _peft()


def _peft():
    try:
        import peft
    except ImportError as err:
        raise MissingExtra("--eval.method.finetune=lora needs the optional extra: pip install 'evalm[lora]'") from err
    return peft


def _lora(model: torch.nn.Module, sched: Schedule) -> torch.nn.Module:
    """Rank-r LoRA adapters on every linear layer but the output head (peft); only they train."""
    peft = _peft()
    if hasattr(model, "get_output_embeddings"):  # transformers: peft's own choice (Conv1D too, never the head)
        targets: str | list[str] = "all-linear"
    else:
        targets = sorted({n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not model.lm_head})
    config = peft.LoraConfig(r=sched.lora_rank, lora_alpha=sched.lora_alpha, lora_dropout=0.0, target_modules=targets)
    return peft.get_peft_model(model, config)


def tune(lm, prompt: PromptBuilder, demos: Sequence[Demo], mode: str) -> tuple[torch.nn.Module, dict]:
    """A fine-tuned copy of `lm`'s model (in `lm`'s dtype) and what training cost."""
    from evalm.train.config import OptimConfig  # [floor note] of icl_eval.tasks.synthetic: one training step
    from evalm.train.local import train_in_process
    from evalm.train.loop import Loop, StepRecipe, make_optimizer, train_step
    from evalm.train.schedule import lr_of

    base = trainable(lm)
    sched, n = SCHEDULE[mode], len(demos)
    dtype = next(base.parameters()).dtype
    seed = random.Random(repr(sorted(d.item_id for d in demos))).randrange(2**31)
    torch.manual_seed(seed)
    model = _cast(copy.deepcopy(base), torch.float32)
    if mode == "lora":
        model = _lora(model, sched)
    batches = DemoBatches(demos, training_rows(prompt, demos), sched.batch_size(n), seed, prompt.tokenizer.eos_id)
    steps = sched.steps(n)
    optim = OptimConfig(lr=sched.lr, betas=(0.9, 0.999), weight_decay=0.0, clip_norm=sched.clip_norm,
                        warmup_steps=max(1, round(sched.warmup_fraction * steps)), min_lr_ratio=0.0)
    autocast = dtype if dtype in (torch.bfloat16, torch.float16) else None
    t0 = time.perf_counter()
    wrapped = Logits(model, autocast)
    loop = Loop(0, steps, train_step, StepRecipe(clip_norm=optim.clip_norm), lr_of(optim, steps))
    losses = train_in_process(wrapped, batches, make_optimizer(wrapped, optim), loop)
    seconds = time.perf_counter() - t0
    n_params = sum(p.numel() for p in base.parameters())
    n_trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    if mode == "lora":
        model = model.merge_and_unload()
    model = _cast(model, dtype).eval()
    # [compute note] training FLOPs ≈ (2 forward + 2 activation gradients + 2 weight gradients) x params per
    # token; LoRA computes no weight gradients of the frozen weights, so 4 x params (Kaplan et al. 2020's 6N)
    flops = (6 if mode == "full" else 4) * n_params * batches.tokens
    return model, {"finetune": mode, "train_steps": steps, "train_batch": sched.batch_size(n), "train_seconds": seconds,
                   "train_tokens": batches.tokens, "train_flops": float(flops), "n_params": n_params,
                   "trained_params": n_trained, "train_loss_first": losses[0], "train_loss_last": losses[-1],
                   "trained_ids": sorted(batches.served), "train_passes": sum(batches.served.values())}


def _cast(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """The parameters in `dtype`, the buffers as they are (a rotary table stays float32), in place; not
    `model.to(dtype)`, which transformers refuses for a model it read from a GGUF file."""
    for p in model.parameters():
        if p.is_floating_point():
            p.data = p.data.to(dtype)
    return model


def zero_shot(item: TestItem, bos: tuple[int, ...]) -> TestItem:
    """The item as a 0-shot prompt shows it: its candidates' lead replaced by `bos` (`PromptBuilder.lead(0)`)."""
    def relead(c: Candidate) -> Candidate:
        shift = len(bos) - c.body_start
        return Candidate(tuple(bos) + c.tokens[c.body_start:], len(bos), c.answer_start + shift, c.answer_end + shift)

    return TestItem(item.item_id, tuple(relead(c) for c in item.candidates), item.gold)


def finetune(lm, prompt: PromptBuilder, demos, items, options: MethodOptions, progress: Progress = None) -> MethodResult:
    """A copy of the model fine-tuned on `demos` ([schedule note]), then every item scored with 0 shots."""
    demos, mode = list(demos), options.finetune
    info: dict = {"finetune": mode, "train_seconds": 0.0, "train_flops": 0.0, "train_tokens": 0, "trained_ids": []}
    scorer = lm
    if demos:
        model, info = tune(lm, prompt, demos, mode)
        scorer = lm.with_model(model)  # the same wrapper (tokenizer, window, device) over the tuned weights
    t0 = time.perf_counter()
    scores = []
    for item in items:
        state = scorer.new_state(0)  # 0 shots: an empty cache, the item led by [bos] as in the 0-shot cell
        scores.append(SCORERS[options.test_prefix](scorer, state, zero_shot(item, prompt.lead(0)), options.scoring))
        if progress:
            progress(1)
    seconds = time.perf_counter() - t0
    info.update(demos_used=[len(demos)] * len(items), context_tokens=0, cache_reuse=False, encode_seconds=0.0,
                seconds=seconds + info["train_seconds"], seconds_per_item=seconds / max(1, len(items)),
                marginal_seconds_per_item=seconds / max(1, len(items)))
    return MethodResult(scores, info)
