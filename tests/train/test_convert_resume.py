"""`evalm train uptrain` on 2 gloo ranks (FSDP2): SIGKILL after a checkpoint, `--resume auto`, bit-exact.

    python -m pytest tests/train/test_convert_resume.py -q

As tests/train/test_resume.py does for pretraining: every run is `train.uptrain.main` in two processes
spawned here the way torchrun starts them. The reference runs 6 steps straight; the other is killed
right after its step-4 checkpoint is complete and resumed. Steps 5-6 must give the reference's losses
(`==`) and the exported model (OUT/hf, written from the last checkpoint, LoRA merged) its weights
(`torch.equal`): on CPU with gloo every reduction has a fixed order, so any state the resume loses
(data cursor, optimizer moments, RNG, the LoRA adapters, EVA's maps kept outside the FSDP units in
attention transfer) shows. Both objectives: LoRA with cross-entropy, and attention transfer.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

from evalm.train import checkpoint  # noqa: E402
from tests.train.llama_helpers import converted_tiny, uptrain_file  # noqa: E402
from tests.train.test_resume import launch as resume_launch  # noqa: E402
from tests.train.test_resume import losses  # noqa: E402

N_STEPS = 6


def _worker(rank: int, world: int, port: int, argv: list[str], kill_after_save: int, kill_in_save: int) -> None:
    """One rank of `evalm train uptrain` (test_resume's launch spawns it); SIGKILLs itself after a save."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    save = checkpoint.save

    def save_then_maybe_die(out, step, *args):
        path = save(out, step, *args)
        if step == kill_after_save:
            os.kill(os.getpid(), signal.SIGKILL)  # the checkpoint is complete on every rank
        return path

    checkpoint.save = save_then_maybe_die
    from evalm.train.uptrain import main

    assert main(argv) == 0


def launch(argv: list[str], kill_after_save: int = -1) -> bool:
    return resume_launch(argv, kill_after_save=kill_after_save, worker=_worker)


def weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    _, eva, shards = converted_tiny(tmp_path_factory.mktemp("uptrain-resume"))
    return eva, shards


# each ~25 s on 2 cores: slow; CI keeps pretraining's resume (tests/train/test_resume.py), the same trainer
@pytest.mark.parametrize("parameters,objective", [
    pytest.param("lora", "lm", marks=pytest.mark.slow), pytest.param("eva", "attention-transfer", marks=pytest.mark.slow)])
def test_sigkill_after_checkpoint_then_resume_is_bit_identical(converted, tmp_path, parameters, objective):
    eva, shards = converted
    run = uptrain_file(tmp_path / "run.toml", eva, shards, parameters=parameters, objective=objective,
                       steps=N_STEPS, save_every=2)
    reference, out = tmp_path / "reference", tmp_path / "run"
    assert launch(["--config", str(run), "--out", str(reference)])
    assert not launch(["--config", str(run), "--out", str(out)], kill_after_save=4)
    assert [p.name for p in checkpoint.complete_checkpoints(out)] == ["step-00000002", "step-00000004"]
    assert not (out / "hf").exists()
    assert launch(["--config", str(run), "--out", str(out), "--resume", "auto"])
    ref, got = losses(reference), losses(out)
    assert sorted(got) == list(range(1, N_STEPS + 1)) and len(set(ref.values())) == N_STEPS
    assert all(got[step] == ref[step] for step in range(1, N_STEPS + 1)), (got, ref)
    a, b = weights(reference / "hf"), weights(out / "hf")
    assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)
    moved = [name for name, w in weights(eva).items() if not torch.equal(w, a[name])]
    assert moved  # the runs trained: the comparison is of weights that changed
