"""`evalm export --hf`: an EVALM checkpoint becomes a folder `transformers` loads with its own classes.

    python -m pytest tests/train/test_export_hf.py -q

Oracles: the checkpoint read by `evalm.io.load_model` (`EvalmModel`, float64) for the logits of
`AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`; the project's own
tokenizer (`load_tokenizer`) for `AutoTokenizer`'s ids, on random texts.
"""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file

transformers = pytest.importorskip("transformers")

from evalm.io import load_model, save_model  # noqa: E402
from evalm.launcher.cli import main as evalm  # noqa: E402
from evalm.text.tokenizer import load_tokenizer  # noqa: E402
from evalm.train import checkpoint  # noqa: E402
from evalm.train.cli import main as train_cli  # noqa: E402
from tests.models import byte_model, visible_model  # noqa: E402
from tests.train.helpers import VOCAB, tiny_run_file, write_shards  # noqa: E402

WORDS = "the a of and to in is was it on good bad news sport yes no".split()


def word_tokenizer(path):
    """A `tokenizers` JSON of a few words and `</s>` (fits the tiny run's 64-token vocabulary)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"</s>": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))
    return path


def _logits_agree(folder, reference, vocab: int) -> None:
    """`transformers`' load of `folder` and `reference` (an EvalmModel) agree in float64 on random ids."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float64)
    assert type(model).__name__ == "EvalmForCausalLM" and model.config.model_type == "evalm"
    ids = torch.randint(0, vocab, (2, 70), generator=torch.Generator().manual_seed(0))
    want = reference.double().eval()(ids)
    assert (model(ids, use_cache=False).logits - want).abs().max() <= 1e-10
    assert (model(ids).logits - want).abs().max() <= 1e-10  # through the EvaCache


def test_export_hf_of_a_training_checkpoint(tmp_path):
    shards = tmp_path / "shards"
    write_shards(shards)
    word_tokenizer(shards / "tokenizer.json")
    run = tiny_run_file(tmp_path / "run.toml", shards, steps=2, save_every=2)
    assert train_cli(["pretrain", "--config", str(run), "--out", str(tmp_path / "out")]) == 0
    step = checkpoint.complete_checkpoints(tmp_path / "out")[-1]
    assert evalm(["export", "--hf", "--checkpoint", str(tmp_path / "out"), "--out", str(tmp_path / "hf")]) == 0
    assert evalm(["export", "--checkpoint", str(tmp_path / "out"), "--out", str(tmp_path / "plain")]) == 0

    plain, hf = load_file(tmp_path / "plain" / "model.safetensors"), load_file(tmp_path / "hf" / "model.safetensors")
    assert plain.keys() == hf.keys() and all(torch.equal(plain[k], hf[k]) for k in plain)
    _logits_agree(tmp_path / "hf", load_model(tmp_path / "plain"), VOCAB)
    assert load_model(tmp_path / "hf").config == load_model(tmp_path / "plain").config  # also an exported EVALM

    ours = load_tokenizer(shards / "tokenizer.json")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    rng = random.Random(0)
    for text in (" ".join(rng.choice(WORDS + ["zebra"]) for _ in range(n)) for n in (1, 5, 40)):
        assert theirs(text, add_special_tokens=False)["input_ids"] == ours.encode(text)
        assert theirs(text)["input_ids"] == [ours.eos_id, *ours.encode(text)]  # EVALM documents start after eos
    assert theirs.eos_token_id == theirs.bos_token_id == ours.eos_id
    record = json.loads((tmp_path / "hf" / "export.json").read_text())
    assert record["checkpoint"] == str(step) and record["tokenizer"] == str(shards / "tokenizer.json")


def test_export_hf_of_an_exported_folder_and_of_its_own_output(tmp_path):
    byte_model(tmp_path / "model")  # exported, bytes: no tokenizer file
    assert evalm(["export", "--hf", "--checkpoint", str(tmp_path / "model"), "--out", str(tmp_path / "hf")]) == 0
    _logits_agree(tmp_path / "hf", load_model(tmp_path / "model"), 257)
    assert evalm(["export", "--hf", "--checkpoint", str(tmp_path / "hf"), "--out", str(tmp_path / "again")]) == 0
    first, again = load_file(tmp_path / "hf" / "model.safetensors"), load_file(tmp_path / "again" / "model.safetensors")
    assert first.keys() == again.keys() and all(torch.equal(first[k], again[k]) for k in first)

    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf", trust_remote_code=True)
    ours = load_tokenizer(None)
    rng = random.Random(1)
    for text in ["héllo wörld\n\t", " leading space", "日本語", "".join(chr(rng.randrange(1, 0x3000)) for _ in range(400))]:
        ids = theirs(text, add_special_tokens=False)["input_ids"]
        assert ids == ours.encode(text) and theirs.decode(ids) == text


def test_what_export_hf_cannot_write_is_one_line(tmp_path, capsys):
    from evalm import ModelConfig

    full = visible_model(ModelConfig(vocab_size=257, d_model=16, n_layer=1, n_head=2, d_ff=32, window_size=8,
                                     chunk_size=4, attention="full"))
    save_model(full, tmp_path / "full")
    assert evalm(["export", "--hf", "--checkpoint", str(tmp_path / "full"), "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip()
    assert "attention='full'" in err and len(err.splitlines()) == 1
    words = visible_model(ModelConfig(vocab_size=VOCAB, d_model=16, n_layer=1, n_head=2, d_ff=32, window_size=8,
                                      chunk_size=4))
    save_model(words, tmp_path / "words")  # no tokenizer beside it, and not a byte vocabulary
    assert evalm(["export", "--hf", "--checkpoint", str(tmp_path / "words"), "--out", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--tokenizer" in err and len(err.splitlines()) == 1
