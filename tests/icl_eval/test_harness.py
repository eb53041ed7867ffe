"""The lm-evaluation-harness backend (icl_eval/harness.py, docs/evaluation.md).

The core runs without lm_eval: prefix-shared scoring == one forward per request (the oracle is
`lm.forward`, no cache), rolling == one full forward, greedy generation == argmax over full
forwards, and no silent truncation. The TemplateLM and `simple_evaluate` tests skip when the
extra is not installed (CI installs `.[dev,harness]`); they use a task built from a local file.
The comparison with lm-eval's own HF backend is tests/icl_eval/test_harness_hf.py.
"""

from __future__ import annotations

import random
import sys

import pytest
import torch

from evalm.icl_eval.harness import (RequestTooLong, fit_request, greedy_generate, harness_lm, rolling_requests,
                              score_requests)

from .conftest import tiny_evalm


def oracle(lm, ctx, cont) -> tuple[float, bool]:
    """One forward of ctx + cont, no cache: the harness's own definition of a loglikelihood."""
    seq = torch.tensor([list(ctx) + list(cont)], dtype=torch.long)
    logp = torch.log_softmax(lm.forward(seq)[0, len(ctx) - 1 : -1].double(), -1)
    target = torch.tensor(list(cont))
    return float(logp.gather(-1, target[:, None]).sum()), bool((logp.argmax(-1) == target).all())


class Counting:
    """Wraps a CausalLM and counts the real tokens it encodes through the cache."""

    def __init__(self, lm):
        self.lm, self.tokens = lm, 0

    def extend(self, state, tokens):
        self.tokens += int(tokens.numel())
        return self.lm.extend(state, tokens)

    def __getattr__(self, name):
        return getattr(self.lm, name)


def shared_prefix_requests(seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """k-shot-like requests: one long demonstration prefix, several questions, 2-3 answers each, plus
    an unrelated context, a context that is a prefix of another, a one-token context and a duplicate."""
    rng = random.Random(seed)
    words = lambda n: [rng.randrange(256) for _ in range(n)]  # noqa: E731
    demos = [256] + words(60)
    reqs = []
    for _ in range(4):
        question = demos + words(rng.randrange(3, 9))
        for _ in range(rng.choice([2, 3])):
            reqs.append((question, words(rng.randrange(1, 5))))
    reqs.append(([256] + words(12), words(3)))
    reqs.append((demos[:30], words(2)))  # ends inside the shared prefix
    reqs.append(([256], words(4)))
    reqs.append(reqs[0])
    rng.shuffle(reqs)
    return reqs


def test_prefix_shared_scoring_equals_one_forward_per_request(lm):
    reqs = shared_prefix_requests()
    counting = Counting(lm)
    got = score_requests(counting, reqs, batch_size=3, segment_tokens=17)
    for (ctx, cont), (lp, greedy) in zip(reqs, got):
        want_lp, want_greedy = oracle(lm, ctx, cont)
        assert lp == pytest.approx(want_lp, abs=1e-6)
        assert greedy == want_greedy
    fed = sum(len(c) + len(t) - 1 for c, t in reqs)
    assert counting.tokens < fed / 3, f"prefix not shared: encoded {counting.tokens} of {fed} request tokens"


def test_prefix_sharing_is_exact_in_float32_on_a_batch_of_one():
    lm = tiny_evalm("eva", seed=3)
    reqs = shared_prefix_requests(seed=1)
    for (ctx, cont), (lp, _) in zip(reqs, score_requests(lm, reqs, batch_size=1)):
        assert lp == pytest.approx(oracle(lm, ctx, cont)[0], rel=1e-5, abs=1e-4)


def test_rolling_without_a_window_is_one_full_forward(lm):
    rng = random.Random(2)
    doc = [rng.randrange(256) for _ in range(90)]
    reqs = rolling_requests(doc, 256, window=None)
    assert len(reqs) == 1
    total = sum(lp for lp, _ in score_requests(lm, reqs, segment_tokens=13))
    logp = torch.log_softmax(lm.forward(torch.tensor([[256] + doc]))[0, :-1].double(), -1)
    assert total == pytest.approx(float(logp.gather(-1, torch.tensor(doc)[:, None]).sum()), abs=1e-6)


def test_rolling_windows_score_every_token_once_within_the_window():
    doc = list(range(21))
    reqs = rolling_requests(doc, 99, window=8)
    assert [t for _, cont in reqs for t in cont] == doc
    assert all(len(c) + len(t) - 1 <= 8 for c, t in reqs)
    assert reqs[1] == ([7], list(range(8, 16)))
    assert rolling_requests([], 99, window=8) == []


def test_no_silent_truncation():
    assert fit_request([1, 2, 3], [4], window=3, overflow="error") == ([1, 2, 3], 0)
    with pytest.raises(RequestTooLong, match="window"):
        fit_request([1, 2, 3, 4], [5, 6], window=4, overflow="error")
    assert fit_request([1, 2, 3, 4], [5, 6], window=4, overflow="drop_left") == ([2, 3, 4], 1)
    with pytest.raises(RequestTooLong, match="continuation alone"):
        fit_request([1], [2, 3, 4, 5, 6], window=4, overflow="drop_left")
    with pytest.raises(ValueError, match="non-empty"):
        score_requests(tiny_evalm("full"), [([], [1])])


def test_greedy_generation_through_the_cache_equals_argmax_over_full_forwards():
    lm = tiny_evalm("eva", seed=1)
    ctx = [256] + list(b"the cache holds the context")
    got = greedy_generate(lm, ctx, 12, segment_tokens=5)
    seq, want = list(ctx), []
    for _ in range(12):
        nxt = int(lm.forward(torch.tensor([seq]))[0, -1].argmax())
        if nxt == 256:
            break
        want.append(nxt)
        seq.append(nxt)
    assert got == want and len(got) > 0
    assert greedy_generate(lm, ctx, 12, stop=lambda ids: len(ids) >= 3) == want[:3]


def test_missing_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    with pytest.raises(ImportError, match=r"evalm\[harness\]"):
        harness_lm(tiny_evalm("full"))


# ----------------------------------------------------------------------------------------------
# With the extra installed.

def _instances(request_type, args_list):
    from lm_eval.api.instance import Instance

    return [Instance(request_type=request_type, doc={}, arguments=a, idx=i) for i, a in enumerate(args_list)]


def test_template_lm_loglikelihood_rolling_and_generate():
    pytest.importorskip("lm_eval")
    lm = tiny_evalm("eva", seed=2, dtype=torch.float64)
    model = harness_lm(lm, batch_size=2)
    demos = "Q: 1+1 A: 2\nQ: 2+2 A: 4\n"
    pairs = [(demos + "Q: 3+3 A:", " 6"), (demos + "Q: 3+3 A:", " 7"), (demos + "Q: 5+5 A:", " 10"), ("", "hello")]
    got = model.loglikelihood(_instances("loglikelihood", pairs), disable_tqdm=True)
    for (ctx, cont), (lp, _) in zip(pairs, got):
        c = [256] + list(ctx.encode()) if ctx else [256]  # TemplateLM: an empty context becomes the prefix token
        assert lp == pytest.approx(oracle(lm, c, list(cont.encode()))[0], abs=1e-6)
    (rolled,) = model.loglikelihood_rolling(_instances("loglikelihood_rolling", [("a whole document",)]), True)
    assert rolled == pytest.approx(oracle(lm, [256], list(b"a whole document"))[0], abs=1e-6)
    (text,) = model.generate_until(_instances("generate_until", [(demos, {"until": ["\n"], "max_gen_toks": 6})]), True)
    ids = greedy_generate(lm, [256, *demos.encode()], 6)
    assert text == bytes(i for i in ids if i < 256).decode("utf-8", "replace").split("\n")[0]


def test_window_overflow_raises_or_is_recorded():
    pytest.importorskip("lm_eval")
    lm = tiny_evalm("full")
    lm.max_positions = 16
    pairs = [("x" * 29, " y")]  # + the bos token: 30 context tokens
    with pytest.raises(RequestTooLong):
        harness_lm(lm).loglikelihood(_instances("loglikelihood", pairs), disable_tqdm=True)
    model = harness_lm(lm, overflow="drop_left")
    model.loglikelihood(_instances("loglikelihood", pairs), disable_tqdm=True)
    assert model.truncations == [{"kind": "loglikelihood", "tokens_cut": 30 + 2 - 1 - 16, "tokens_kept": 16 + 1}]


TASK_YAML = """\
task: local_parity
dataset_path: json
dataset_kwargs:
  data_files:
    train: {data}/train.jsonl
    test: {data}/test.jsonl
training_split: train
test_split: test
fewshot_split: train
fewshot_config:
  sampler: first_n
output_type: multiple_choice
doc_to_text: "Number: {{{{x}}}} Parity:"
doc_to_choice: ["even", "odd"]
doc_to_target: "{{{{y}}}}"
metric_list:
  - metric: acc
"""


def test_simple_evaluate_and_the_cli_on_a_local_task(tmp_path, monkeypatch):
    """One local task (no hub), through `evaluate` and through `evalm eval harness` on an exported checkpoint."""
    pytest.importorskip("lm_eval")
    import json

    from evalm.io import save_model
    from evalm.icl_eval.cli import main
    from evalm.icl_eval.harness import evaluate

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    for split, numbers in (("train", range(10)), ("test", range(10, 16))):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps({"x": n, "y": n % 2}) + "\n" for n in numbers))
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "local_parity.yaml").write_text(TASK_YAML.format(data=tmp_path))
    lm = tiny_evalm("eva")
    out = evaluate(lm, ["local_parity"], num_fewshot=3, seeds=(1, 2), include_path=str(tmp_path / "tasks"),
                   add_bos=False)
    acc = out["summary"]["local_parity"]["acc,none"]
    assert 0.0 <= acc["mean"] <= 1.0 and acc["n_seeds"] == 2
    assert [r["seed"] for r in out["runs"]] == [1, 2] and out["truncations"] == []

    save_model(lm.model, tmp_path / "ckpt")
    rc = main(["harness", "--checkpoint", str(tmp_path / "ckpt"), "--tasks", "local_parity", "--include-path",
               str(tmp_path / "tasks"), "--num-fewshot", "3", "--seeds", "1,2", "--out", str(tmp_path / "run"),
               "--no-add-bos"])
    written = json.loads((tmp_path / "run" / "results.json").read_text())
    assert rc == 0 and written["summary"] == out["summary"]  # same weights, same seeds: the same numbers
    assert written["add_bos"] is False and out["add_bos"] is False  # the flag reached the model
    assert harness_lm(lm).add_bos is True  # EVALM's default: its documents start with bos
