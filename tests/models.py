"""Small models and tasks for tests: random decoders whose attention patterns are visible in their
outputs, an exported byte-level model, a two-label task file."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from evalm import EvalmModel, ModelConfig


def visible_model(config: ModelConfig, seed: int = 0) -> EvalmModel:
    """A model of `config` with the reference inits, then every matrix redrawn from N(0, 0.3²).

    OPT's 0.006 init makes an untrained model nearly uniform; a larger scale makes attention
    patterns (and so any masking or ordering bug) visible in the scores.
    """
    torch.manual_seed(seed)
    model = EvalmModel(config)
    model.init_weights()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    return model


def byte_model(folder: Path) -> Path:
    """An exported one-layer EVALM over bytes (vocab 257) in `folder`, so eval commands load a model
    instead of training the built-in one."""
    from evalm.io import save_model

    torch.manual_seed(0)
    model = EvalmModel(ModelConfig(vocab_size=257, d_model=16, n_layer=1, n_head=2, d_ff=32, window_size=8,
                                   chunk_size=4, circular_period=512, dropout=0.0, attn_dropout=0.0))
    model.init_weights()
    return save_model(model, folder)


def two_label_task(folder: Path, n_train: int = 8, n_test: int = 4) -> Path:
    """A task file in `folder` whose rows `item i` alternate between two labels, train and test."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"text": f"item {i}", "label": i % 2} for i in range(n_train)]
    for split, part in (("train", rows), ("test", rows[:n_test])):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    path = folder / "task.toml"
    path.write_text('[task]\ntemplate = "{text} {label}"\nlabels = ["no", "yes"]\n'
                    'train = "train.jsonl"\ntest = "test.jsonl"\n')
    return path


WORDS = ("the a of and to in is was it on review movie film good bad great poor news sport market world "
         "label text item yes no positive negative story game team price city").split()


def hf_tokenizer(folder: Path):
    """A byte-level BPE trained here on a few sentences (no hub), saved to `folder`; `<pad>` is id 0 (T5's)
    and `</s>` the eos."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<pad>", "</s>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(folder)
    return fast


def hf_causal_lm(folder: Path, kind: str = "gpt2", n_positions: int = 2048) -> Path:
    """A tiny random decoder (`gpt2` or `opt`) with `hf_tokenizer`, saved as a Hugging Face model folder."""
    import transformers

    tok = hf_tokenizer(folder)
    torch.manual_seed(0)
    if kind == "opt":
        config = transformers.OPTConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, ffn_dim=64,
                                        num_attention_heads=4, max_position_embeddings=n_positions, word_embed_proj_dim=32,
                                        pad_token_id=tok.pad_token_id, bos_token_id=tok.eos_token_id,
                                        eos_token_id=tok.eos_token_id)
        model = transformers.OPTForCausalLM(config)
    else:
        config = transformers.GPT2Config(vocab_size=len(tok), n_positions=n_positions, n_embd=32, n_layer=2, n_head=4,
                                         bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)
        model = transformers.GPT2LMHeadModel(config)
    model.save_pretrained(folder)
    return folder


def hf_t5(folder: Path) -> Path:
    """A tiny random T5 (icl_eval.models.t5's shape) with `hf_tokenizer`, saved as a Hugging Face model folder."""
    import transformers

    from evalm.icl_eval.models.t5 import T5Shape, tiny_t5_config

    tok = hf_tokenizer(folder)
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(tiny_t5_config(T5Shape(vocab_size=len(tok), eos_id=tok.eos_token_id)))
    model.save_pretrained(folder)
    return folder


def hf_llama(seed: int = 0, **overrides):
    """A tiny random Llama (grouped-query attention: 4 query heads over 2 key/value heads, RoPE) in
    float64 with weights drawn from N(0, 0.3²), so attention patterns show in its outputs."""
    import transformers

    shape = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512, bos_token_id=None, eos_token_id=None,
                 attn_implementation="eager")
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**shape, **overrides}))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
    return model.double().eval()
