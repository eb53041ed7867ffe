"""`evalm run --set run.seed=S`: one training seed for every training stage, so the front table's
spread over training trajectories (docs/results.md) is one flag away.

    python -m pytest tests/launcher/test_run_seed.py -q
"""

from __future__ import annotations

from pathlib import Path

from evalm.launcher.keys import stage_key
from evalm.launcher.run_file import load_run
from evalm.launcher.stages import stage_commands
from evalm.train.command import TrainCommand, parse_run_args
from evalm.train.config import DataConfig, MsitDataConfig


def _run_file(tmp_path: Path) -> Path:
    path = tmp_path / "run.toml"
    # The run file's own seed in [pretrain] set: `run.seed` must win over it.
    path.write_text(f'[run]\nroot = "{tmp_path / "runs"}"\nsamples = "{tmp_path / "samples"}"\n'
                    '[pretrain]\nset = ["train.seed=3", "train.steps=5"]\n[[eval]]\nname = "synthetic"\n')
    return path


def _training_commands(r) -> list[list[str]]:
    return [a for stage in ("pretrain", "msit", "twins") for a in stage_commands(r, stage) if a[:2] != ["train", "msit-data"]]


def _seeds(argv: list[str]) -> tuple[int, int]:
    """The seeds `evalm train` itself parses from the stage's command (the trainer's own parser is the oracle)."""
    data_cls = MsitDataConfig if argv[1] == "msit" else DataConfig
    config, _, _ = parse_run_args(argv[2:], TrainCommand("x", data_cls=data_cls))
    return config.train.seed, config.data.seed


def test_run_seed_reaches_every_training_stage_and_wins_over_the_run_files_own(tmp_path):
    path = _run_file(tmp_path)
    plain, seeded = load_run(path), load_run(path, ["run.seed=7", "run.name=tiny-seed7"])
    commands = _training_commands(seeded)
    assert len(commands) == 5  # pretrain, msit, full twin's pretrain and msit, absolute twin's pretrain
    assert all(_seeds(a) == (7, 7) for a in commands)
    assert seeded.dir == tmp_path / "runs" / "tiny-seed7"
    # Unset, each config's own seeds: the [pretrain] set's 3 (and data.seed 1234), msit's defaults.
    assert _seeds(stage_commands(plain, "pretrain")[0]) == (3, 1234)
    assert _seeds(stage_commands(plain, "msit")[1]) == (0, 1234)
    # Another seed is another stage key, so a rerun in the same folder redoes training, never skips it.
    assert stage_key(plain, "pretrain", stage_commands(plain, "pretrain"), "") != \
        stage_key(seeded, "pretrain", stage_commands(seeded, "pretrain"), "")


def test_evalm_run_reads_set_and_its_dotted_alias(tmp_path, capsys):
    """The command line reaches the run file: `--set run.name=...` and `--run.seed=...` (the alias)
    name the folder the refusal speaks of (`--only` needs the earlier stages of THAT folder)."""
    from evalm.launcher.run import main

    assert main([str(_run_file(tmp_path)), "--set", "run.name=tiny-seed7", "--run.seed=7", "--only", "pretrain"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'runs' / 'tiny-seed7'}: stage 'pretrain' needs ['tokenizer'], not done" in err and len(err.strip().splitlines()) == 1, err
    assert main([str(_run_file(tmp_path)), "--set", "run.seed=two"]) == 2
    assert "seed" in capsys.readouterr().err
