"""`evalm eval harness` against lm-eval's own HF backend (`lm_eval --model hf`), request by request.

Run: python -m pytest tests/icl_eval/test_harness_hf.py -q   (needs the `harness` extra; CI installs it)
One tiny random GPT-2 (window 64) saved to a temporary folder with two local byte-level BPE
tokenizers built here (no hub): a GPT-2-style one (adds no bos) and a Llama-style one (adds <s>).
The same folder is loaded by `lm_eval.models.huggingface.HFLM` and by `icl_eval.models.hf.load_hf` +
`harness_lm`; every request type is compared: loglikelihood, loglikelihood_rolling on documents
several windows long, generate_until with lm-eval's `max_new_tokens` alias. float32 on both sides:
the log-likelihoods agree to float32 rounding (`_bound`: ulps of each summed term, so the bound grows
with the sum, as rounding does), generations exactly.
"""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("lm_eval")
pytest.importorskip("accelerate")
transformers = pytest.importorskip("transformers")

from evalm.icl_eval.harness import harness_lm, rolling_requests  # noqa: E402
from tests.icl_eval.test_t5 import one_thread  # noqa: E402, F401 (autouse: one torch thread)

WINDOW = 64
EPS32 = torch.finfo(torch.float32).eps
ULPS_PER_TERM = 16


def _bound(total: float, n_terms: int) -> float:
    """How far two float32 computations of a sum of `n_terms` token log-probabilities may differ.

    Each term log p_i = z_y - logsumexp(z) comes out of matmuls whose rounding depends on the kernel
    and the shapes (lm-eval's batch of 1 vs ours of 3 with padding; AVX2 vs AVX-512 vs AMX change
    the accumulation order), so the two sides differ by a few ulps of the term's magnitude,
    |log p_i| + O(1) (the logsumexp of logits of a few units), and a float32 sum adds at most an
    ulp of its running total per term. Since every log p_i <= 0, sum |log p_i| = |total|; so
    ULPS_PER_TERM ulps per term, added up linearly (no cancellation assumed), is
    ULPS_PER_TERM * eps32 * (|total| + n_terms). Measured on an AMD EPYC (AVX-512, no AMX): at most
    1.2 of those ulps, e.g. 3e-5 on the rolling sum of 757 tokens near -5,344 (an absolute 1e-4 failed
    there on the same CPU in another process: 1.2e-4, 0.16 ulps per term). A wrong token, window or bos moves
    a sum by nats, thousands of times this bound."""
    return ULPS_PER_TERM * EPS32 * (abs(total) + n_terms)


def _assert_sums_agree(got: list[float], want: list[float], n_terms: list[int]) -> None:
    for g, w, n in zip(got, want, n_terms, strict=True):
        assert abs(g - w) <= _bound(w, n), (g, w, n, _bound(w, n))
CORPUS = ["The quick brown fox jumps over the lazy dog. " * 3, "Language models predict the next token of a text.",
          "Question: what is two plus two? Answer: four.\n", "Numbers: 1 2 3 4 5 6 7 8 9 10."] * 20


def _tokenizer(llama_style: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>", "<s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = "<s>" if llama_style else "<|endoftext|>"
    if llama_style:  # Llama's tokenizers add <s> by default; lm-eval's HF backend then starts every context with it
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token="<|endoftext|>")


@pytest.fixture(scope="module", params=["gpt2-style", "llama-style"])
def folder(request, tmp_path_factory):
    return build_model(tmp_path_factory.mktemp(request.param), request.param)


def build_model(path, style: str):
    """A random GPT-2 of window 64 and the `style` tokenizer, saved to `path` (a Hugging Face model folder)."""
    tok = _tokenizer(style == "llama-style")
    tok.save_pretrained(path)
    eos = tok.eos_token_id
    config = transformers.GPT2Config(vocab_size=len(tok), n_positions=WINDOW, n_embd=32, n_layer=2, n_head=4,
                                     bos_token_id=tok.bos_token_id, eos_token_id=eos)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():  # wide weights: attention far from uniform, so a wrong window or token moves the numbers
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    model.save_pretrained(path)
    return path


def _pair(folder, add_bos=None):
    from lm_eval.models.huggingface import HFLM

    from evalm.icl_eval.models.hf import load_hf

    theirs = HFLM(pretrained=str(folder), device="cpu", batch_size=1, dtype="float32", add_bos_token=add_bos)
    ours = harness_lm(load_hf(folder, attn_implementation="eager"), batch_size=3, add_bos=add_bos)
    return theirs, ours


def _instances(request_type, args_list):
    from lm_eval.api.instance import Instance

    return [Instance(request_type=request_type, doc={}, arguments=a, idx=i) for i, a in enumerate(args_list)]


def _max_diff(a, b) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


DEMOS = "Question: what is one plus one? Answer: two.\nQuestion: what is two plus two? Answer:"
PAIRS = [(DEMOS, " four."), (DEMOS, " five."), (DEMOS + " ", "four."), ("The quick brown", " fox jumps"),
         ("", "Numbers: 1 2 3"), ("Language", " models predict the next token")]


@pytest.mark.parametrize("add_bos", [None, True, False], ids=["default", "add-bos", "no-add-bos"])
def test_loglikelihood_and_tokenization_equal_lm_evals_hf_backend(folder, add_bos):
    theirs, ours = _pair(folder, add_bos)
    assert ours.prefix_token_id == theirs.prefix_token_id
    for text in (DEMOS, "<s>" + DEMOS, "hello"):
        assert ours.tok_encode(text) == theirs.tok_encode(text)
        assert ours.tok_encode(text, add_special_tokens=False) == theirs.tok_encode(text, add_special_tokens=False)
    want = theirs.loglikelihood(_instances("loglikelihood", PAIRS), disable_tqdm=True)
    got = ours.loglikelihood(_instances("loglikelihood", PAIRS), disable_tqdm=True)
    _assert_sums_agree([g[0] for g in got], [w[0] for w in want],
                       [len(ours.tok_encode(c, add_special_tokens=False)) for _, c in PAIRS])
    assert [g[1] for g in got] == [w[1] for w in want]
    if add_bos is None:  # the default follows the tokenizer: GPT-2 adds no bos, Llama adds <s>
        assert ours.add_bos == ("llama" in folder.name)


def test_the_bos_switch_matters(folder):
    """With and without bos the numbers differ (so the default's agreement above is not vacuous)."""
    _, with_bos = _pair(folder, True)
    _, without = _pair(folder, False)
    a = with_bos.loglikelihood(_instances("loglikelihood", PAIRS), disable_tqdm=True)
    b = without.loglikelihood(_instances("loglikelihood", PAIRS), disable_tqdm=True)
    assert _max_diff([x[0] for x in a], [x[0] for x in b]) > 1e-2


def test_rolling_equals_lm_evals_hf_backend_on_documents_longer_than_the_window(folder):
    theirs, ours = _pair(folder)
    rng = random.Random(0)
    words = lambda: " ".join(rng.choice(CORPUS).split()[: rng.randrange(4, 12)])  # noqa: E731
    docs = [" ".join(words() for _ in range(n)) for n in (1, 12, 30, 45)]
    lengths = [len(ours.tok_encode(d)) for d in docs]
    assert lengths[0] < WINDOW and min(lengths[1:]) > 2 * WINDOW and any(n % WINDOW for n in lengths)
    want = theirs.loglikelihood_rolling(_instances("loglikelihood_rolling", [(d,) for d in docs]), disable_tqdm=True)
    got = ours.loglikelihood_rolling(_instances("loglikelihood_rolling", [(d,) for d in docs]), disable_tqdm=True)
    _assert_sums_agree(got, want, lengths)
    # the window after the first ones conditions on one token: a wrong last window moves the sum by nats
    assert min(abs(w) for w in want) > 10


def test_rolling_windows_are_lm_evals_windows():
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    for n in (1, 7, 8, 9, 16, 17, 30, 64, 65, 100):
        tokens = list(range(1000, 1000 + n))
        for window in (1, 4, 8, 13):
            want = [tuple(map(list, make_disjoint_window(w))) for w in
                    get_rolling_token_windows(tokens, prefix_token=7, max_seq_len=window, context_len=1)]
            assert [tuple(map(list, r)) for r in rolling_requests(tokens, 7, window)] == want, (n, window)


GEN = [(DEMOS, {"until": ["\n"], "max_new_tokens": 7}), (DEMOS, {"until": ["."], "max_gen_toks": 4}),
       ("The quick brown", {"until": ["zzz"], "max_new_tokens": 12, "do_sample": False, "temperature": 0.7}),
       ("Numbers: 1 2", {"until": "\n\n", "max_new_tokens": 20})]


def test_generate_until_equals_lm_evals_hf_backend(folder):
    theirs, ours = _pair(folder)
    want = theirs.generate_until(_instances("generate_until", GEN), disable_tqdm=True)
    got = ours.generate_until(_instances("generate_until", GEN), disable_tqdm=True)
    assert got == want
    lengths = [len(ours.tok_encode(t, add_special_tokens=False)) for t in got]
    assert lengths[2] > 4  # the alias was read: not cut at another request's budget


def test_sampling_is_seeded_and_bad_settings_are_refused(folder):
    _, ours = _pair(folder)
    req = [("The quick brown", {"until": ["zzz"], "max_new_tokens": 16, "do_sample": True, "temperature": 1.5})] * 2
    a = ours.generate_until(_instances("generate_until", req), disable_tqdm=True)
    assert a == ours.generate_until(_instances("generate_until", req), disable_tqdm=True)  # same seed, same draws
    ours.seed = 1
    b = ours.generate_until(_instances("generate_until", req), disable_tqdm=True)
    greedy = ours.generate_until(_instances("generate_until", [(req[0][0], {"until": ["zzz"], "max_new_tokens": 16})]), True)
    assert a != b and greedy[0] not in (a + b)
    with pytest.raises(ValueError, match="temperature > 0"):
        ours.generate_until(_instances("generate_until", [(DEMOS, {"do_sample": True})]), disable_tqdm=True)
    with pytest.raises(ValueError, match="num_beams"):
        ours.generate_until(_instances("generate_until", [(DEMOS, {"num_beams": 4})]), disable_tqdm=True)
