"""BOS per model (prompts.resolve_bos, hf.HFTokenizerAdapter.default_bos) on tiny local tokenizers.

Run: python -m pytest tests/icl_eval/test_bos.py -q
Each tokenizer is built here with `tokenizers` and saved/loaded through `transformers` (no hub):
GPT-2 style (one `<|endoftext|>` for bos and eos, nothing prepended), a declared BOS distinct from
the eos (SmolLM2-Instruct's `<|im_start|>` / `<|im_end|>`), and a tokenizer that prepends `<s>`
itself (Llama). Oracle: the ids the saved vocabulary gives those tokens.
"""

from __future__ import annotations

import json

import pytest

from evalm.text.tokenizer import ByteTokenizer
from evalm.icl_eval.tasks.prompts import PromptBuilder, resolve_bos
from evalm.icl_eval.tasks.task import Task

transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer, models, pre_tokenizers, processors  # noqa: E402

VOCAB = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>", "</s>", "Review:", "good", "bad",
         "film", "Sentiment:", "negative", "positive"]
TASK = Task("t", "Review: {text} Sentiment: {label}", ("negative", "positive"))


def tiny_tokenizer(folder, bos: str | None, eos: str, prepend: str | None = None):
    from evalm.icl_eval.models.hf import HFTokenizerAdapter

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if prepend:
        tok.post_processor = processors.TemplateProcessing(single=f"{prepend} $A", special_tokens=[(prepend, VOCAB.index(prepend))])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, unk_token="<unk>")
    fast.save_pretrained(folder)
    return HFTokenizerAdapter(transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True))


def test_gpt2_style_gets_no_bos(tmp_path):
    tok = tiny_tokenizer(tmp_path, bos="<|endoftext|>", eos="<|endoftext|>")
    ids, why = resolve_bos(tok)
    assert ids == () and "GPT-2" in why


def test_a_declared_bos_distinct_from_eos_is_used(tmp_path):
    tok = tiny_tokenizer(tmp_path, bos="<|im_start|>", eos="<|im_end|>")
    assert resolve_bos(tok)[0] == (VOCAB.index("<|im_start|>"),)


def test_a_tokenizer_that_prepends_its_bos_gets_that_token(tmp_path):
    tok = tiny_tokenizer(tmp_path, bos=None, eos="</s>", prepend="<s>")
    assert resolve_bos(tok)[0] == (VOCAB.index("<s>"),)


def test_evalm_gets_its_end_of_document_token_and_overrides_win(tmp_path):
    assert resolve_bos(ByteTokenizer())[0] == (256,)
    tok = tiny_tokenizer(tmp_path, bos="<|im_start|>", eos="<|im_end|>")
    assert resolve_bos(tok, "none")[0] == ()
    assert resolve_bos(tok, "eos")[0] == (VOCAB.index("<|im_end|>"),)
    assert resolve_bos(tok, "<|endoftext|>")[0] == (VOCAB.index("<|endoftext|>"),)
    with pytest.raises(ValueError, match="--bos 'no such'"):
        resolve_bos(tok, "no such")


def test_prompts_start_with_the_resolved_bos(tmp_path):
    tok = tiny_tokenizer(tmp_path, bos="<|im_start|>", eos="<|im_end|>")
    item = {"text": "good film", "label": 1}
    for spec, lead in (("auto", [VOCAB.index("<|im_start|>")]), ("none", [])):
        prompt = PromptBuilder(TASK, tok, bos=spec)
        demo = prompt.demo(0, item)
        assert prompt.context([demo])[: len(lead) + 1] == lead + [VOCAB.index("Review:")]
        zero = prompt.test_item(0, item, 0).candidates[1]
        assert list(zero.tokens[: zero.body_start]) == lead and zero.tokens[zero.body_start] == VOCAB.index("Review:")
        assert prompt.describe_bos()["ids"] == lead


def test_the_cli_records_the_bos_and_takes_the_flag(tmp_path):
    from evalm.icl_eval.cli import main

    out = tmp_path / "icl"
    assert main(["icl", "--out", str(out), "--shots", "0,2", "--seeds", "1", "--methods", "incremental",
                 "--bos", "none", "--synthetic.train_steps=2", "--eval.test_items=2"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["protocol"]["bos"]["ids"] == [] and res["protocol"]["eval"]["bos"] == "none"
