"""A project tokenizer as a `transformers` tokenizer folder: what `evalm export --hf` writes beside the model.

`save_hf_tokenizer(source, folder)` writes tokenizer.json and tokenizer_config.json that
`AutoTokenizer.from_pretrained(folder)` loads and that encode every text as
`load_tokenizer(source)` does (with `add_special_tokens=False`; by default the end-of-document
token is prepended, the bos of an EVALM document, and it is both bos and eos):
a `tokenizers` JSON is copied as it is; raw bytes (`ByteTokenizer`, no file) become a byte-level
BPE without merges whose id of each byte is the byte (256: `</s>`). A SentencePiece `.model` is
refused: converting it is `transformers`' own business (`LlamaTokenizerFast`), not done here.
"""

from __future__ import annotations

import json
from pathlib import Path

from evalm.config_toolkit import ConfigError, MissingExtra
from evalm.text.tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer

BYTE_EOS = "</s>"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what `tokenizers`' ByteLevel pre-tokenizer emits)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_tokenizer():
    """A `tokenizers.Tokenizer` that encodes as `ByteTokenizer`: byte b -> id b, `</s>` -> 256."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: byte for byte, char in _bytes_to_unicode().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(BYTE_EOS, special=True)])
    return tok


def save_hf_tokenizer(source: str | Path | None, folder: Path) -> str:
    """Write the `transformers` tokenizer of `source` (None: bytes) into `folder`; returns its eos token."""
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError as err:
        raise MissingExtra("--hf needs the optional extra: pip install 'evalm[hf]'") from err
    tok = load_tokenizer(source)
    if isinstance(tok, ByteTokenizer):
        backend, eos = byte_tokenizer(), BYTE_EOS
    elif isinstance(tok, HFTokenizer):
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(tok.path))
        eos = backend.id_to_token(tok.eos_id)
    else:
        raise ConfigError(f"--tokenizer {source}: a SentencePiece model is not converted to a transformers tokenizer; "
                          "give a tokenizers JSON (tokenizer.json) or export without --hf")
    from tokenizers import processors

    # EVALM's documents start after the end-of-document token (bos = eos, docs/training.md): prepended
    # with add_special_tokens, as a Llama tokenizer prepends <s>, so lm-eval's HF backend starts every
    # context with it as the project's harness backend does
    backend.post_processor = processors.TemplateProcessing(single=f"{eos} $A", pair=f"{eos} $A $B",
                                                           special_tokens=[(eos, backend.token_to_id(eos))])
    PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=eos, eos_token=eos).save_pretrained(folder)
    config = Path(folder) / "tokenizer_config.json"  # the class name every transformers version knows
    config.write_text(json.dumps({**json.loads(config.read_text()), "tokenizer_class": "PreTrainedTokenizerFast"},
                                 indent=2) + "\n")
    return eos
