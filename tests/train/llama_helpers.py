"""A tiny Llama-family `transformers` folder built in the test (no download), for tests/train/test_convert*.py."""

from __future__ import annotations

from pathlib import Path

from tests.models import hf_llama
from tests.train.helpers import VOCAB


def word_tokenizer(vocab: int = VOCAB):
    """A `transformers` tokenizer of `vocab` words `t0 … t{vocab-1}` (eos the last), as the shards' ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=f"t{vocab - 1}", unk_token="t0")


def tiny_llama_folder(folder: Path, *, dtype: str = "float64", seed: int = 0, **overrides) -> Path:
    """`tests.models.hf_llama` (grouped-query heads, RoPE, weights wide enough that attention shows) with
    the shards' vocabulary and tied embeddings, saved with its tokenizer as a `transformers` folder."""
    import torch

    shape = {"vocab_size": VOCAB, "tie_word_embeddings": True, "eos_token_id": VOCAB - 1,
             "attn_implementation": "sdpa", **overrides}  # sdpa keeps float64 (eager softmaxes in float32)
    model = hf_llama(seed, **shape).to(getattr(torch, dtype))
    model.save_pretrained(folder)
    word_tokenizer(model.config.vocab_size).save_pretrained(folder)
    return folder


def converted_tiny(root: Path) -> tuple[Path, Path, Path]:
    """The tiny Llama (float32) under `root`, its EVA conversion (w = 8, c = 4: on 32-token lines 3 of 4
    blocks use summaries) and token shards: (source, converted, shards)."""
    from evalm.train.convert import main as convert_main
    from tests.train.helpers import write_shards

    source = tiny_llama_folder(root / "llama", dtype="float32")
    assert convert_main(["--hf-model", str(source), "--out", str(root / "eva"), "--set", "eva.window_size=8",
                         "--set", "eva.chunk_size=4"]) == 0
    write_shards(root / "tokens")
    return source, root / "eva", root / "tokens"


def uptrain_file(path, converted, shards, *, parameters: str = "eva", objective: str = "attention-transfer",
                 steps: int = 6, save_every: int = 2, extra: str = "", lr: float = 3e-2):
    """A run file small enough that a step takes well under a second."""
    path.write_text(f"""
[model]
hf_model = "{converted}"
parameters = "{parameters}"
lora_rank = 4
[data]
shards = "{shards}"
seq_len = 32
[optim]
lr = {lr}
weight_decay = 0.0
warmup_steps = 2
[train]
steps = {steps}
batch_size = 2
grad_accum = 2
device = "cpu"
[checkpoint]
save_every = {save_every}
keep_latest_k = 0
[uptrain]
objective = "{objective}"
{extra}""")
    return path
