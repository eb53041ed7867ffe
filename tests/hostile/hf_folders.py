"""Tiny Hugging Face folders built here (no hub), and the edits a careless or hostile user makes to them:
a header rewritten, a config.json edited, code planted with an `auto_map` that asks for it."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

from tests.train.llama_helpers import tiny_llama_folder

PLANTED = "planted.txt"
"""The file the planted code writes beside itself when it runs: its existence is the proof it ran."""
EVIL = f'''"""Code a model folder ships: it must never run."""
from pathlib import Path

Path(__file__).with_name("{PLANTED}").write_text("the folder's code ran")

from transformers import PreTrainedTokenizerFast


class EvilTokenizer(PreTrainedTokenizerFast):
    pass
'''


def llama(folder: Path, **overrides) -> Path:
    """The tiny float32 Llama of tests/train (2 layers, hidden 32, vocabulary 64) with its tokenizer."""
    return tiny_llama_folder(folder, dtype="float32", **overrides)


def copy(source: Path, folder: Path) -> Path:
    return Path(shutil.copytree(source, folder))


def edit_json(path: Path, **changes) -> Path:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data, indent=2))
    return path


def plant_code(folder: Path, file: str = "tokenizer_config.json") -> Path:
    """`tokenization_evil.py` in the folder and an `auto_map` in `file` that asks transformers to import it
    (the planted code writes PLANTED when it runs)."""
    (folder / "tokenization_evil.py").write_text(EVIL)
    mapping = {"AutoTokenizer": [None, "tokenization_evil.EvilTokenizer"]} if file == "tokenizer_config.json" \
        else {"AutoConfig": "tokenization_evil.EvilConfig", "AutoModelForCausalLM": "tokenization_evil.EvilModel"}
    edit_json(folder / file, auto_map=mapping)
    return folder


def header(path: Path) -> tuple[dict, bytes]:
    """A safetensors file's JSON header and the bytes after it."""
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_header(path: Path, value: dict, rest: bytes) -> None:
    text = json.dumps(value).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + rest)
