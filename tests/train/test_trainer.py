"""The trainer as a user drives it: configs, schedule, logs, checkpoints, refusals, MSIT from a checkpoint.

    python -m pytest tests/train/test_trainer.py -q

Runs are one process (a world of one on gloo, created and destroyed by the trainer itself).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from evalm.config_toolkit import ConfigError
from tests.train.helpers import tiny_run_file, write_shards
from evalm.train import checkpoint
from evalm.train.cli import main as cli_main
from evalm.train.config import MsitDataConfig, load_run_config
from evalm.train.schedule import lr_at

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
TRAIN_CONFIGS = ["pretrain-tiny", "msit-tiny", "evalm-350m", "evalm-1.3b", "msit", "msit-plus"]


@pytest.fixture(autouse=True)
def _no_leaked_group():
    yield
    if dist.is_initialized():  # a failed run must not leave its group to the next test
        dist.destroy_process_group()


@pytest.mark.parametrize("name", TRAIN_CONFIGS)
def test_shipped_configs_validate(name):
    data_cls = MsitDataConfig if name.startswith("msit") else None
    run = load_run_config(CONFIGS / f"{name}.toml", [], *([data_cls] if data_cls else []))
    if name == "evalm-350m":
        assert (run.model.d_model, run.model.n_head, run.model.n_layer, run.data.seq_len) == (1024, 16, 24, 8192)
        assert (run.optim.lr, run.optim.weight_decay, run.optim.clip_norm) == (8e-5, 0.1, 1.0)  # Table 6
    if name == "evalm-1.3b":
        assert (run.model.d_model, run.model.n_head, run.model.n_layer) == (2048, 32, 24)
    if name == "msit-plus":
        assert run.data.seq_len == 16384


def test_unknown_key_names_file_section_and_valid_keys(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[train]\nstepz = 3\n")
    with pytest.raises(ConfigError, match=r"run.toml \[train\]: unknown key\(s\) \['stepz'\]; valid keys: .*'steps'"):
        load_run_config(path, [])
    run = load_run_config(CONFIGS / "pretrain-tiny.toml", ["train.steps=7", "model.attention=full"])
    assert (run.train.steps, run.model.attention) == (7, "full")
    with pytest.raises(ConfigError, match="attention='flash' is not known; valid: \\['eva', 'full', 'window'\\]"):
        load_run_config(CONFIGS / "pretrain-tiny.toml", ["model.attention=flash"])


def test_lr_warms_up_then_decays_polynomially_to_the_floor():
    kw = dict(lr=1.0, warmup_steps=4, total_steps=14, min_lr_ratio=0.1)
    assert [lr_at(s, **kw) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    decay = [lr_at(s, **kw) for s in range(4, 14)]
    assert decay[0] == 1.0 and all(a > b for a, b in zip(decay, decay[1:]))
    assert lr_at(9, **kw) == pytest.approx(0.1 + 0.9 * 0.5)  # linear (power 1) halfway
    assert lr_at(14, **kw) == lr_at(100, **kw) == pytest.approx(0.1)
    assert lr_at(9, **kw, decay_power=2.0) == pytest.approx(0.1 + 0.9 * 0.25)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    write_shards(root / "tokens")
    run_file = tiny_run_file(root / "run.toml", root / "tokens", steps=4, save_every=2, attention="full")
    out = root / "out"
    assert cli_main(["pretrain", "--config", str(run_file), "--out", str(out)]) == 0
    return run_file, out


def test_run_writes_config_metrics_and_marked_checkpoints(finished_run, capsys):
    run_file, out = finished_run
    config = json.loads((out / "config.json").read_text())
    assert config["command"] == "pretrain" and config["model"]["attention"] == "full"
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu", "peak_mem_gib", "eta_s", "tokens_seen"):
        assert key in records[0]
    assert records[-1]["tokens_seen"] == 4 * 2 * 2 * 32
    steps = [p.name for p in checkpoint.complete_checkpoints(out)]
    assert steps == ["step-00000002", "step-00000004"]
    assert json.loads((out / "checkpoints" / steps[-1] / "config.json").read_text())["model"] == config["model"]


def test_fresh_run_refuses_a_folder_with_checkpoints(finished_run, capsys):
    run_file, out = finished_run
    assert cli_main(["pretrain", "--config", str(run_file), "--out", str(out)]) == 2
    assert "--resume auto" in capsys.readouterr().err


def test_resume_with_another_architecture_is_refused(finished_run, capsys):
    run_file, out = finished_run
    code = cli_main(["pretrain", "--config", str(run_file), "--out", str(out), "--resume", "auto",
                     "--set", "model.n_layer=3", "--set", "train.steps=6"])
    err = capsys.readouterr().err
    assert code == 2 and "different architecture" in err and "n_layer: checkpoint 2, config 3" in err


def test_keep_latest_k_prunes_old_checkpoints_and_save_debris(finished_run, tmp_path):
    from evalm.storage import RunFolder

    run_file, out = finished_run
    RunFolder(tmp_path, "evalm train pretrain").mark()  # this command's run folder, where
    (tmp_path / "checkpoints" / ".tmp-step-00000001").mkdir(parents=True)  # a save was killed long ago
    assert cli_main(["pretrain", "--config", str(run_file), "--out", str(tmp_path),
                     "--set", "checkpoint.keep_latest_k=1", "--set", "checkpoint.save_every=1"]) == 0
    assert [p.name for p in checkpoint.complete_checkpoints(tmp_path)] == ["step-00000004"]
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000004"]


def test_msit_starts_from_a_pretrained_checkpoint(finished_run, tmp_path, capsys):
    run_file, pretrained = finished_run
    data = tmp_path / "it.jsonl"
    rows = [{"task": t, "input": f"{t} {i}", "output": str(i % 7)} for i in range(40) for t in ("a", "b", "c")]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = run_file.read_text().split("[data]")[0] + f"""
[data]
train_file = "{data}"
tokenizer = "bytes"
seq_len = 64
held_out_tasks = ["c"]

[optim]
lr = 1e-3
warmup_steps = 1

[train]
steps = 3
batch_size = 2
device = "cpu"

[checkpoint]
save_every = 0
init_from = "{pretrained}"
"""
    msit_file = tmp_path / "msit.toml"
    msit_file.write_text(text.replace("vocab_size = 64", "vocab_size = 257"))
    # the pretrained model has 64 ids: a different architecture, refused by name
    assert cli_main(["msit", "--config", str(msit_file), "--out", str(tmp_path / "bad")]) == 2
    assert "vocab_size: checkpoint 64, config 257" in capsys.readouterr().err
    pretrained_257 = tmp_path / "pretrained-257"  # the same model with a byte vocabulary
    assert cli_main(["pretrain", "--config", str(run_file), "--out", str(pretrained_257),
                     "--set", "model.vocab_size=257", "--set", "train.steps=1"]) == 0
    msit_file.write_text(text.replace("vocab_size = 64", "vocab_size = 257").replace(str(pretrained), str(pretrained_257)))
    out = tmp_path / "msit"
    assert cli_main(["msit", "--config", str(msit_file), "--out", str(out)]) == 0
    log = capsys.readouterr().out
    assert "initialised the model from" in log and "held out 40 examples of ['c']" in log
    assert [p.name for p in checkpoint.complete_checkpoints(out)] == ["step-00000003"]



def test_activation_checkpointing_recomputes_and_bf16_computes_in_bf16(finished_run, tmp_path, monkeypatch):
    """Each flag is proven by what it does, on the model the trainer builds (its MLPs' calls counted):

    - AC recomputes every block in backward: each MLP runs twice per micro-batch (once without AC),
      and with dropout's RNG replayed the losses still match the plain run bit for bit;
    - bf16 computes in bf16: the MLPs see bfloat16 activations (float32 without it), and the losses
      move by rounding only (~1e-2, docs/model.mdO13's bf16 tolerance) but do move.
    """
    from evalm.model import MLP
    from evalm.train import trainer

    run_file, _ = finished_run
    common = ["pretrain", "--config", str(run_file), "--set", "checkpoint.save_every=0", "--set", "train.steps=3"]
    real_build, seen = trainer.build_model, {}

    def observed_build(*args, **kwargs):
        model = real_build(*args, **kwargs)
        for mlp in (m for m in model.modules() if isinstance(m, MLP)):
            # the instance's forward, not a forward hook: checkpoint's recomputation does not fire module hooks
            def counted(x, _forward=mlp.forward):
                seen["calls"].append(x.dtype)
                return _forward(x)
            mlp.forward = counted
        return model

    monkeypatch.setattr(trainer, "build_model", observed_build)

    def run(name: str, *extra: str) -> tuple[list[float], list[torch.dtype]]:
        seen["calls"] = []
        assert cli_main([*common, "--out", str(tmp_path / name), *extra]) == 0
        losses = [json.loads(line)["loss"] for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return losses, seen["calls"]

    plain, plain_calls = run("plain")
    assert len(plain_calls) == 3 * 2 * 2  # steps x grad_accum x layers: one forward each
    assert set(plain_calls) == {torch.float32}
    ac, ac_calls = run("ac", "--set", "train.activation_checkpointing=true")
    assert len(ac_calls) == 2 * len(plain_calls)  # every block recomputed in backward
    assert ac == plain
    bf16, bf16_calls = run("bf16", "--set", 'train.mixed_precision="bf16"')
    assert set(bf16_calls) == {torch.bfloat16} and len(bf16_calls) == len(plain_calls)
    assert bf16 == pytest.approx(plain, rel=1e-2) and bf16 != plain


@pytest.mark.parametrize("attention", ["full", "eva"])
def test_compiled_blocks_train_as_the_eager_ones(finished_run, tmp_path, attention):
    """`train.compile` compiles each block (dynamo builds graphs; none without it) and changes no loss beyond
    float reassociation (dropout off: compiled dropout draws other masks); the checkpoint's parameter names
    are the eager run's, so either may resume the other."""
    from torch._dynamo.utils import counters

    run_file, _ = finished_run
    common = ["pretrain", "--config", str(run_file), "--set", "checkpoint.save_every=3", "--set", "train.steps=3",
              "--set", "model.dropout=0.0", "--set", "model.attn_dropout=0.0", "--set", f'model.attention="{attention}"']

    def run(name: str, *extra: str) -> tuple[list[float], int]:
        counters.clear()
        assert cli_main([*common, "--out", str(tmp_path / name), *extra]) == 0
        losses = [json.loads(line)["loss"] for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return losses, counters["stats"]["unique_graphs"]

    eager, eager_graphs = run("eager")
    compiled, compiled_graphs = run("compiled", "--set", "train.compile=true")
    assert eager_graphs == 0 and compiled_graphs >= 1
    assert compiled == pytest.approx(eager, rel=1e-5)  # EVA's noise seeds drawn eagerly: the same ε
    recomputed, _ = run("compiled-ac", "--set", "train.compile=true", "--set", "train.activation_checkpointing=true")
    assert recomputed == pytest.approx(eager, rel=1e-5)  # and replayed in the recomputation
    from evalm.train.dcp_metadata import read_metadata_file

    keys = [sorted(read_metadata_file(tmp_path / n / "checkpoints" / "step-00000003" / ".metadata").state_dict_metadata)
            for n in ("eager", "compiled")]
    assert keys[0] == keys[1] and any("blocks.0." in k for k in keys[0])
