"""What an uptraining run reads, checked (issue "Hostile inputs, third round", item 6).

    python -m pytest tests/hostile/test_uptrain_inputs.py -q

`evalm train uptrain` trained on token shards of another tokenizer (a vocabulary of 64 under the
model's), resumed after the converted weights were replaced in place or after the objective
changed, and `export_run(trainables=...)` took another run's trainable tensors (same names, same
shapes); `lora_targets` naming no module ended as a bug line. Each is now one line (exit 2, or the
InputError of the Python call) naming what to do, on a tiny Llama converted here.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.hostile.conftest import one_line
from tests.train.helpers import write_shards
from tests.train.llama_helpers import converted_tiny, tiny_llama_folder, uptrain_file, word_tokenizer

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(the tiny Llama, its EVA conversion, shards of its tokenizer's 64 ids)."""
    return converted_tiny(tmp_path_factory.mktemp("uptrain-inputs"))


def uptrain(run: Path, out: Path, *extra: str) -> int:
    from evalm.train.uptrain import main

    try:
        return main(["--config", str(run), "--out", str(out), *extra])
    except SystemExit as stop:  # the run file's refusals exit from the parser, as training's do
        return stop.code


def test_shards_of_another_tokenizer_are_refused(converted, tmp_path, capsys):
    _, eva, _ = converted
    write_shards(tmp_path / "small", vocab=48)  # another tokenizer's ids: all below 64, so nothing else noticed
    run = uptrain_file(tmp_path / "run.toml", eva, tmp_path / "small")
    assert uptrain(run, tmp_path / "out") == 2  # was: trained on them
    line = one_line(capsys.readouterr().err)
    assert f"[data] shards = '{tmp_path / 'small'}' were written with another tokenizer than [model] hf_model" in line
    assert "vocab_size: shards 48, model 64" in line and "--tokenizer" in line
    permuted = tmp_path / "permuted"  # the same size, the ids of other words
    tok = word_tokenizer(64)
    vocab = {f"t{i}": 63 - i for i in range(64)}
    from tokenizers import Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel(vocab, unk_token="t63"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    permuted.mkdir()
    backend.save(str(permuted / "tokenizer.json"))
    from evalm.train.shards import ShardWriter

    writer = ShardWriter(tmp_path / "other", vocab_size=len(tok), eos_id=0, tokenizer=str(permuted / "tokenizer.json"),
                         tokens_per_shard=1500)
    for i in range(40):
        writer.add(list(range(1, 40)), "a")
    writer.close()
    run = uptrain_file(tmp_path / "run2.toml", eva, tmp_path / "other")
    capsys.readouterr()
    assert uptrain(run, tmp_path / "out2") == 2
    assert "maps tokens to other ids than the model's tokenizer" in one_line(capsys.readouterr().err)


def test_a_resume_after_the_weights_or_the_objective_changed_is_refused(converted, tmp_path, capsys):
    source, _, shards = converted
    eva = Path(shutil.copytree(converted[1], tmp_path / "eva"))
    run = uptrain_file(tmp_path / "run.toml", eva, shards, objective="lm", steps=2, save_every=1)
    out = tmp_path / "out"
    assert uptrain(run, out) == 0
    longer = ["--set", "train.steps=3", "--resume", "auto"]
    capsys.readouterr()
    assert uptrain(run, out, "--set", "uptrain.objective=\"attention-transfer\"", *longer) == 2
    line = one_line(capsys.readouterr().err)  # was: resumed, training toward another objective
    assert "was trained with another objective (objective: checkpoint 'lm', now 'attention-transfer')" in line, line
    from evalm.train.convert import main as convert

    other = tiny_llama_folder(tmp_path / "other-llama", dtype="float32", seed=1)
    assert convert(["--hf-model", str(other), "--out", str(tmp_path / "eva2"), "--set", "eva.window_size=8",
                    "--set", "eva.chunk_size=4"]) == 0
    weights = eva / "model.safetensors"
    shutil.copyfile(tmp_path / "eva2" / "model.safetensors", weights)  # replaced in place, the same name
    capsys.readouterr()
    assert uptrain(run, out, *longer) == 2  # was: resumed from weights trained on the old ones
    line = one_line(capsys.readouterr().err)
    assert "was trained with another weights (weights: checkpoint 'sha256:" in line, line


def test_trainables_of_another_run_are_refused(converted, tmp_path):
    from evalm.config_toolkit import InputError
    from evalm.train.uptrain import load_config
    from evalm.train.uptrain_model import export_run, save_trainables

    _, eva, shards = converted
    files = {}
    for name, lr in (("a", 3e-2), ("b", 1e-2)):  # two runs of one [model]: the same tensor names and shapes
        run = uptrain_file(tmp_path / f"{name}.toml", eva, shards, parameters="lora", objective="lm", steps=1, lr=lr)
        assert uptrain(run, tmp_path / name) == 0
        files[name] = save_trainables(tmp_path / name, load_config(run, []), tmp_path / f"{name}.safetensors")
    config_b = load_config(tmp_path / "b.toml", [])
    with pytest.raises(InputError, match=rf"{files['a']}: written by run {tmp_path / 'a'} \(key sha256:"):
        export_run(tmp_path / "rebuilt", config_b, trainables=files["a"])  # was: accepted, run a's tensors under b
    assert export_run(tmp_path / "rebuilt", config_b, trainables=files["b"]).is_dir()


def test_lora_targets_naming_no_module_are_one_line(converted, tmp_path, capsys):
    _, eva, shards = converted
    run = uptrain_file(tmp_path / "run.toml", eva, shards, parameters="lora", objective="lm",
                       extra="")
    run.write_text(run.read_text().replace("lora_rank = 4", "lora_rank = 4\nlora_targets = [\"q_prj\"]"))
    assert uptrain(run, tmp_path / "out") == 2  # was: peft's ValueError, a bug line
    line = one_line(capsys.readouterr().err)
    assert "[model] lora_targets ['q_prj']: no linear layer of the model has that name; valid: [" in line, line
    assert "'q_proj'" in line
