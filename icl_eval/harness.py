"""lm-evaluation-harness backend: any `CausalLM` (EVALM, or a Hugging Face model) as a `TemplateLM`.

docs/evaluation.md: standard harness tasks run on EVALM checkpoints, launched through
`lm_eval.simple_evaluate` (the harness has no plugin entry point), with

- cache reuse across requests that share a token prefix. The harness has none: its HF backend
  re-encodes every (context, continuation) pair. `score_requests` walks the requests as a radix
  tree over their contexts: each shared prefix is encoded once into our cache (in segments, which
  is exact: tests/icl_eval/test_methods.py) and `fork()`ed for every branch, so k-shot
  demonstrations shared by all test questions (a fixed sampler, e.g. `first_n`) are encoded once;
- no silent left-truncation: the harness's HF backend cuts `(context + continuation)[-max_length:]`
  without a word; here a request longer than the window raises `RequestTooLong`, or with
  `overflow="drop_left"` is cut and recorded in `HarnessLM.truncations`;
- a seed loop for std (`evaluate`), and the fixed demonstrations come from the task's own
  `fewshot_config` (set `sampler: first_n` in a task YAML to share them across test questions).

Otherwise the numbers are lm-eval's HF backend's (`lm_eval --model hf`), request by request
(tests/icl_eval/test_harness_hf.py): the same tokenization (`add_bos` unset follows the model's
tokenizer, as `add_bos_token` unset does there; the prefix token is bos, else eos), lm-eval's own
rolling windows, and `generate_until` reading `max_gen_toks` / `max_new_tokens` / `do_sample` /
`temperature` as lm-eval does (icl_eval/models/decoding.py; sampling is seeded, not HF's draw).

The core (`score_requests`, `rolling_requests`, `greedy_generate`) needs only `torch`: the extra
`harness` (`pip install 'evalm[harness]'`) is imported lazily, by `harness_lm` and `evaluate`.

    from evalm.icl_eval.harness import evaluate
    evaluate(lm, tasks=["my_task"], num_fewshot=16, seeds=(1, 2, 3), include_path="tasks/")
    evalm eval harness --checkpoint DIR --tasks my_task --include-path tasks/ --num-fewshot 16 --seeds 1,2,3
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from evalm.config_toolkit import ConfigError, MissingExtra, UserError
from evalm.icl_eval.models.decoding import GenerationSettings, generate
from evalm.icl_eval.models.lm import CausalLM, right_pad

Request = tuple[Sequence[int], Sequence[int]]
"""(context tokens, continuation tokens); the context is never empty (the harness prepends a prefix token)."""


class RequestTooLong(UserError, ValueError):
    """A request that does not fit the model's window (never cut silently)."""


def _extend(lm: CausalLM, state, tokens: Sequence[int], segment_tokens: int) -> torch.Tensor | None:
    """Feed `tokens` into a batch-1 `state` in segments (exact for any split); the last segment's logits."""
    logits = None
    for i in range(0, len(tokens), segment_tokens):
        logits = lm.extend(state, torch.tensor([list(tokens[i : i + segment_tokens])], dtype=torch.long))
    return logits


def _common_prefix(rows: list[Sequence[int]], start: int) -> int:
    """The length of the longest common prefix of `rows` (all known to agree on [0, start))."""
    end = min(len(r) for r in rows)
    first = rows[0]
    n = start
    while n < end and all(r[n] == first[n] for r in rows):
        n += 1
    return n


def score_requests(lm: CausalLM, requests: Sequence[Request], batch_size: int = 16,
                   segment_tokens: int = 4096) -> list[tuple[float, bool]]:
    """(sum log p(continuation | context), is the continuation greedy) per request, sharing prefixes.

    Request i feeds `head_i + tail_i` where `head_i = context[:-1]` (shared through the cache) and
    `tail_i = context[-1:] + continuation[:-1]`, whose logits predict the continuation. Requests
    are a radix tree over their heads: a node's tokens are encoded once into a cache that every
    child forks; the requests whose head ends at a node are scored there, `batch_size` at a time,
    as one right-padded batch of forks (right padding never reaches the real tokens).
    Equal to scoring every request by its own one-shot forward (tests/icl_eval/test_harness.py).
    """
    heads, tails = [], []
    for i, (ctx, cont) in enumerate(requests):
        if not ctx or not cont:
            raise ValueError(f"request {i}: context and continuation must be non-empty (got {len(ctx)}, {len(cont)} tokens)")
        heads.append(list(ctx[:-1]))
        tails.append(list(ctx[-1:]) + list(cont[:-1]))
    out: list[tuple[float, bool] | None] = [None] * len(requests)
    # An explicit stack, not recursion (nested contexts, e.g. rolling windows, can be deep). An entry
    # is (parent cache holding heads[:start], depth, idx): the child is forked and extended only when
    # popped, so at most one branch's extended cache is alive per level (not one per test question).
    stack = [(lm.new_state(0), 0, 0, list(range(len(requests))))]
    while stack:
        parent, start, depth, idx = stack.pop()
        state = parent
        if depth > start:
            state = lm.fork(parent)  # the parent is never advanced once it has children
            _extend(lm, state, heads[idx[0]][start:depth], segment_tokens)
        here = [i for i in idx if len(heads[i]) == depth]  # `state` holds heads[i][:depth] for every i in idx
        for b in range(0, len(here), batch_size):
            _score_batch(lm, state, here[b : b + batch_size], tails, requests, out)
        branches: dict[int, list[int]] = {}
        for i in idx:
            if len(heads[i]) > depth:
                branches.setdefault(heads[i][depth], []).append(i)
        for group in branches.values():
            stack.append((state, depth, _common_prefix([heads[i] for i in group], depth + 1), group))
    return out  # type: ignore[return-value]


def _score_batch(lm: CausalLM, state, batch: list[int], tails, requests, out) -> None:
    kids = lm.fork(state, batch_size=len(batch))
    logits = lm.extend(kids, right_pad([tails[i] for i in batch], lm.tokenizer.eos_id))
    logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)  # float64 stays
    for row, i in enumerate(batch):
        cont = torch.tensor(list(requests[i][1]), dtype=torch.long, device=logp.device)
        lp = logp[row, : len(cont)]
        out[i] = (float(lp.gather(-1, cont[:, None]).sum()), bool((lp.argmax(-1) == cont).all()))


def fit_request(ctx: Sequence[int], cont: Sequence[int], window: int | None, overflow: str) -> tuple[list[int], int]:
    """The request's context, cut from the left only if allowed, and how many tokens were cut.

    The model sees len(ctx) + len(cont) - 1 tokens. Past the window: `error` raises; `drop_left`
    keeps the last tokens (at least one context token) and returns the count for the record.
    """
    need = len(ctx) + len(cont) - 1
    if window is None or need <= window:
        return list(ctx), 0
    if overflow != "drop_left":
        raise RequestTooLong(
            f"a request of {len(ctx)} context + {len(cont)} continuation tokens needs {need} positions; the window "
            f"is {window}. Use fewer shots, a model without a window (EVALM), or overflow='drop_left' (recorded)")
    cut = need - window
    if cut >= len(ctx):
        raise RequestTooLong(f"the continuation alone ({len(cont)} tokens) does not fit the window of {window}")
    return list(ctx[cut:]), cut


def rolling_requests(tokens: Sequence[int], prefix_id: int, window: int | None) -> list[Request]:
    """A document's loglikelihood_rolling as (context, continuation) requests covering every token once.

    No window (EVALM): one request, `[prefix] -> tokens`, which the cache encodes in segments, so
    every token sees the whole document before it. A window W: lm-eval's own windows,
    `make_disjoint_window(get_rolling_token_windows(tokens, prefix, W, context_len=1))`
    (lm_eval/utils.py): the first predicts W tokens after the prefix token, every full window after
    it W tokens after the one token before them, and the last, shorter window is filled back with
    context to W model positions (tests/icl_eval/test_harness_hf.py compares them request by request).
    """
    tokens = list(tokens)
    if not tokens:
        return []
    if window is None:
        return [([prefix_id], tokens)]
    done = min(window, len(tokens))
    out: list[Request] = [([prefix_id], tokens[:done])]
    while done < len(tokens):
        n = min(len(tokens) - done, window)
        end = done + n
        out.append((tokens[end - window - 1 : end - n], tokens[done:end]))  # context + continuation - 1 == W
        done = end
    return out


def greedy_generate(lm: CausalLM, context: Sequence[int], max_new_tokens: int, stop=lambda ids: False,
                    segment_tokens: int = 4096) -> list[int]:
    """Greedy decoding through the cache: the context is encoded once, then one token per step."""
    return generate(lm, context, GenerationSettings(max_new_tokens), stop, segment_tokens)


def default_add_bos(tokenizer) -> bool:
    """What lm-eval's HF backend does with `add_bos_token` unset: whatever the model's own tokenizer does
    by default (a Hugging Face tokenizer's `add_special_tokens=True`: GPT-2 adds nothing, Llama adds <s>).
    An EVALM tokenizer has no such default; EVALM documents start with bos (= eos), so True."""
    hf = getattr(tokenizer, "_tok", None)  # icl_eval.models.hf.HFTokenizerAdapter's transformers tokenizer
    if hf is None:
        return True
    with_special, plain = hf("a")["input_ids"], hf("a", add_special_tokens=False)["input_ids"]
    return hf.bos_token_id is not None and with_special[:1] == [hf.bos_token_id] != plain[:1]


# ----------------------------------------------------------------------------------------------
# The harness side (optional extra).

def _lm_eval():
    try:
        import lm_eval
        import lm_eval.api.model  # noqa: F401
    except ImportError as err:
        raise MissingExtra("the lm-evaluation-harness backend is an optional extra: pip install 'evalm[harness]' "
                           "(lm-eval>=0.4.13, accelerate)") from err
    return lm_eval


@dataclass(frozen=True)
class HarnessOptions:
    """How `HarnessLM` serves the harness: requests per batch, tokens per encoded segment, a request past
    the window refused ('error') or cut from the left ('drop_left'), the default new-token budget of
    generate_until, a leading bos (None: the tokenizer's habit) and the seed of sampled draws."""

    batch_size: int = 16
    segment_tokens: int = 4096
    overflow: str = "error"
    max_gen_toks: int = 256
    add_bos: bool | None = None
    seed: int = 0


class _HarnessMethods:
    """`HarnessLM`'s methods: a `CausalLM` behind the harness (loglikelihood, prefix-shared; rolling;
    generate_until). A mixin, so this module defines them without importing lm_eval;
    `_harness_class` puts them in front of lm_eval's `TemplateLM` on first use."""

    def __init__(self, lm: CausalLM, options: HarnessOptions = HarnessOptions()):
        super().__init__()
        if options.overflow not in ("error", "drop_left"):
            raise ConfigError(f"overflow={options.overflow!r}: use 'error' or 'drop_left'")
        self.lm, self.batch_size, self.segment_tokens = lm, options.batch_size, options.segment_tokens
        self.overflow, self.max_gen_toks, self.seed = options.overflow, options.max_gen_toks, options.seed
        self.add_bos = default_add_bos(lm.tokenizer) if options.add_bos is None else bool(options.add_bos)
        self.truncations: list[dict[str, Any]] = []
        """One entry per request cut under overflow='drop_left': kind, tokens cut, tokens kept."""

    @property
    def eot_token_id(self) -> int:
        return self.lm.tokenizer.eos_id

    @property
    def prefix_token_id(self) -> int:
        # lm-eval's HF backend: the tokenizer's bos token if it has one, else eos (EVALM: bos = eos)
        bos = getattr(getattr(self.lm.tokenizer, "_tok", None), "bos_token_id", None)
        return self.eot_token_id if bos is None else int(bos)

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.lm.tokenizer, "name", type(self.lm.tokenizer).__name__))

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        # lm-eval's HF backend: an explicit flag wins; unset means `add_bos`, unless the text already
        # starts with the bos token's text. The bos token is the prefix token (EVALM: `[bos] d_1 ...`).
        ids = list(self.lm.tokenizer.encode(string))
        bos = self.add_bos if add_special_tokens is None else add_special_tokens
        if add_special_tokens is None and bos:
            text = self.tok_decode([self.prefix_token_id])
            bos = not (text and string.startswith(text))
        return [self.prefix_token_id, *ids] if bos else ids

    def tok_decode(self, tokens) -> str:
        return self.lm.tokenizer.decode(list(tokens))

    def _fit(self, ctx, cont, kind: str) -> list[int]:
        ctx, cut = fit_request(ctx, cont, self.lm.max_positions, self.overflow)
        if cut:
            self.truncations.append({"kind": kind, "tokens_cut": cut, "tokens_kept": len(ctx) + len(cont)})
        return ctx

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        pairs = [(self._fit(ctx, cont, "loglikelihood"), cont) for _, ctx, cont in requests]
        results = score_requests(self.lm, pairs, self.batch_size, self.segment_tokens)
        for (key, _, _), res in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", key, res)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        out = []
        for req in requests:
            (text,) = req.args
            # lm-eval encodes the document as a context (its bos, if added, is scored after the prefix
            # token); an EVALM tokenizer's bos *is* the prefix token, so it is not doubled there.
            hf = getattr(self.lm.tokenizer, "_tok", None) is not None
            tokens = self.tok_encode(text, add_special_tokens=None if hf else False)
            pairs = rolling_requests(tokens, self.prefix_token_id, self.lm.max_positions)
            total = sum(lp for lp, _ in score_requests(self.lm, pairs, self.batch_size, self.segment_tokens))
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), total)
            out.append(total)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        for i, req in enumerate(requests):
            context, gen_kwargs = req.args
            settings = GenerationSettings.from_request(gen_kwargs, self.max_gen_toks)
            # lm-eval adds the eos text to the stop strings; every draw has its own seeded generator
            eos = self.tok_decode([self.eot_token_id])
            until = [*settings.until, *([eos] if eos not in settings.until else [])]
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + i) if settings.do_sample else None
            n_new = settings.max_new_tokens
            ctx = self._fit(self.tok_encode(context), [0] * (n_new + 1), "generate_until")
            ids = generate(self.lm, ctx, settings, lambda ids: any(s and s in self.tok_decode(ids) for s in until),
                           self.segment_tokens, generator)
            text = self.tok_decode(ids)
            for s in until:
                text = text.split(s)[0] if s else text
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), text)
            out.append(text)
        return out


@functools.cache
def _harness_class():
    """`HarnessLM`, built on first use so that importing this module never needs lm_eval."""
    from lm_eval.api.model import TemplateLM

    class HarnessLM(_HarnessMethods, TemplateLM):
        """A `CausalLM` behind the harness: loglikelihood (prefix-shared), rolling, generate_until."""

    return HarnessLM


def harness_lm(lm: CausalLM, **options):
    """The `TemplateLM` over `lm` (options: `HarnessOptions`' fields)."""
    _lm_eval()
    return _harness_class()(lm, HarnessOptions(**options))


def evaluate(lm: CausalLM, tasks: Sequence[str], num_fewshot: int | None = None, seeds: Sequence[int] = (1,),
             limit: int | float | None = None, include_path: str | None = None, **options) -> dict[str, Any]:
    """`lm_eval.simple_evaluate` once per seed (the few-shot draw and every RNG), plus mean ± std per metric."""
    lm_eval = _lm_eval()
    from lm_eval.tasks import TaskManager

    model = harness_lm(lm, **options)
    manager = TaskManager(include_path=include_path) if include_path else TaskManager()
    runs = []
    for seed in seeds:
        model.seed = seed  # sampled generate_until draws
        res = lm_eval.simple_evaluate(model=model, tasks=list(tasks), num_fewshot=num_fewshot, limit=limit,
                                      task_manager=manager, random_seed=seed, numpy_random_seed=seed,
                                      torch_random_seed=seed, fewshot_random_seed=seed, log_samples=False,
                                      bootstrap_iters=0)
        runs.append({"seed": seed, "results": res["results"], "n_samples": res.get("n-samples")})
    return {"runs": runs, "summary": _summarize([r["results"] for r in runs]),
            "truncations": list(model.truncations), "overflow": model.overflow, "add_bos": model.add_bos}


def _summarize(per_seed: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, dict[str, float]]]:
    """task -> metric -> mean/std over seeds (numeric metrics only; the harness's stderr fields skipped)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for task in per_seed[0]:
        for metric, value in per_seed[0][task].items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or "stderr" in metric:
                continue
            values = [float(r[task][metric]) for r in per_seed]
            out.setdefault(task, {})[metric] = {
                "mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                "n_seeds": len(values)}
    return out
