"""The README's PG-19 command, run as written on a 300,000-token book, scores it to 262,144 tokens.

An implicit tiny config used to cap that command at 4,096 tokens and 8,192-token buckets.
Here the command line is read from README.md itself; only the model and output folders are swapped
for a tiny byte-level EVALM (1 token per byte) and a temporary folder.

Run: python -m pytest tests/icl_eval/test_ppl_readme.py -q
"""

from __future__ import annotations

import json
import random
import shlex
from pathlib import Path

import torch

from evalm import EvalmModel, ModelConfig
from evalm.io import save_model
from evalm.launcher.cli import main
from tests.hub_cache import write_hub_cache

REPO = Path(__file__).resolve().parents[2]
BOOK_TOKENS = 300_000


def readme_pg19_command() -> list[str]:
    """`evalm eval ppl ... deepmind/pg19:test ...` from README.md, as a user would paste it."""
    lines = [ln for ln in (REPO / "README.md").read_text().splitlines()
             if ln.startswith("evalm eval ppl") and "deepmind/pg19:test" in ln]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])[1:]  # without `evalm`


def _swap(argv: list[str], flag: str, value: str) -> list[str]:
    i = argv.index(flag)
    return argv[: i + 1] + [value] + argv[i + 2:]


def _book(n_bytes: int) -> str:
    """ASCII prose-like text (byte tokens: one token per character)."""
    rng = random.Random(0)
    words = ["the", "whale", "sea", "ship", "captain", "of", "and", "a", "white", "storm", "deck", "night"]
    text, size = [], 0
    while size < n_bytes:
        text.append(rng.choice(words) + (". " if rng.random() < 0.1 else " "))
        size += len(text[-1])
    return "".join(text)[:n_bytes]


def _tiny_checkpoint(folder: Path) -> Path:
    """One narrow layer; window = chunk = 1024, so 262,144 tokens have only 256 remote summaries (the
    remote attention is n x n/c: with c = 8 the same book takes minutes on a CPU, with c = 1024 seconds)."""
    torch.manual_seed(0)
    model = EvalmModel(ModelConfig(vocab_size=257, d_model=8, n_layer=1, n_head=1, d_ff=16, window_size=1024,
                                   chunk_size=1024, circular_period=4096, dropout=0.0, attn_dropout=0.0))
    model.init_weights()
    return save_model(model, folder)


def test_readme_pg19_command_scores_a_300k_token_book_to_262144(tmp_path, capsys, one_thread):
    argv = readme_pg19_command()
    assert argv[argv.index("--lengths") + 1] == "1024,8192,65536,262144"
    write_hub_cache(tmp_path, "deepmind/pg19", None, {"test": {
        "short_book_title": ["Long Book"], "publication_date": [1900], "url": ["http://example.org/1"],
        "text": [_book(BOOK_TOKENS)]}})
    argv = _swap(_swap(argv, "--checkpoint", str(_tiny_checkpoint(tmp_path / "ckpt"))), "--out", str(tmp_path / "out"))
    assert main(argv) == 0
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["books"] == [{"book": "Long Book", "tokens": 262_144, "words": res["books"][0]["words"],
                             "bytes": 262_144}]
    cached = res["protocols"]["cached"]
    assert cached["overall"]["tokens"] == 262_144
    assert [b["bucket"] for b in cached["buckets"]] == [[0, 1024], [1024, 8192], [8192, 65536], [65536, 262144]]
    assert [b["tokens"] for b in cached["buckets"]] == [1024, 8192 - 1024, 65536 - 8192, 262144 - 65536]
    assert res["settings"]["values"]["ppl"]["max_tokens"] == 262_144 and res["settings"]["config"] is None
    assert res["skipped"] == []
    out = capsys.readouterr().out
    assert "ppl.buckets = (1024, 8192, 65536, 262144)  (--lengths)" in out  # the settings block
    assert "ppl.max_tokens = 262144" in out

    # a length the book cannot supply: an error naming it, or with --allow-skip a recorded skip
    longer = _swap(argv, "--lengths", "1024,524288") + ["--max-tokens", "524288"]
    assert main(longer) == 2
    err = capsys.readouterr().err
    assert "524288" in err and "300000 tokens" in err and "Traceback" not in err
