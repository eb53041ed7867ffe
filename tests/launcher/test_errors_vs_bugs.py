"""Every `evalm` command tells a user's mistake (one line, exit 2) from a bug of ours (exit 1, one line
that says so and names the file holding its traceback): a bug printed as "error: ..." would send the
user to fix an input that is fine.

Each case calls `evalm.launcher.cli.main` in this process, as the `evalm` script does. A bug is a
real internal failure: one internal function of the command, the ones its own code calls, made to
raise a plain built-in error.

Run: python -m pytest tests/launcher/test_errors_vs_bugs.py -q
"""

from __future__ import annotations

import pytest

from evalm.launcher import cli
from evalm.launcher import run as launcher_run
from tests.models import byte_model, two_label_task
from tests.train.helpers import free_port, tiny_run_file, write_shards


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("EVALM_DEBUG", raising=False)


def evalm(capsys, *argv: object) -> tuple[int, list[str]]:
    """`evalm ARGV` in this process: its exit status and the lines it wrote to stderr (progress bars aside)."""
    capsys.readouterr()
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as exit_:  # argparse's own one-line refusals exit through SystemExit
        code = exit_.code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, [ln for ln in err.splitlines() if ln.strip() and "\r" not in ln]


def one_line(capsys, *argv: object) -> str:
    code, lines = evalm(capsys, *argv)
    assert code == 2 and len(lines) == 1, lines
    assert ": bug:" not in lines[0]
    return lines[0]


def a_bug(capsys, log, *argv: object) -> str:
    """The console line of a bug: exit 1, a last line naming `log`, which holds the traceback (the
    command's own warnings may come before it)."""
    code, lines = evalm(capsys, *argv)
    assert code == 1 and lines and sum(": bug: " in ln for ln in lines) == 1, lines
    assert ": bug: " in lines[-1] and "not your input" in lines[-1] and f"traceback in {log};" in lines[-1], lines
    assert log.read_text().startswith("Traceback (most recent call last)")
    return lines[-1]


def _broken(error: BaseException):
    def broken(*args, **kwargs):
        raise error

    return broken


# ---------------------------------------------------------------- evalm eval


def test_eval_mistakes_are_one_line(capsys, tmp_path):
    line = one_line(capsys, "eval", "icl", "--shots", "4", "--budgets", "64")
    assert line.startswith("evalm eval icl: error: --budgets and --shots: ")
    line = one_line(capsys, "eval", "icl", "--set", "eval.bogus=1")
    assert "unknown key(s) ['bogus']" in line
    ckpt = byte_model(tmp_path / "model")
    line = one_line(capsys, "eval", "icl", "--checkpoint", ckpt, "--task", tmp_path / "nope.toml", "--shots", "0",
                    "--out", tmp_path / "out")
    assert str(tmp_path / "nope.toml") in line


def test_an_eval_bug_names_the_log_in_its_output_folder(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("evalm.icl_eval.models.loading.load_lm", _broken(ValueError("too many values to unpack")))
    (tmp_path / "book.txt").write_text("a book " * 200)
    out = tmp_path / "out"
    line = a_bug(capsys, out / "logs" / "error.log", "eval", "ppl", "--books", tmp_path / "book.txt",
                 "--lengths", "64", "--out", out)
    assert line.startswith("evalm eval ppl: bug: ValueError: too many values to unpack")
    assert "in broken" in (out / "logs" / "error.log").read_text()


def test_an_icl_bug_deep_in_a_run_is_a_bug(capsys, tmp_path, monkeypatch):
    """A built-in error raised where the refusals of the ICL code are raised too (its protocol)."""
    monkeypatch.setattr("evalm.icl_eval.protocol.runner.Runner.run_unit", _broken(IndexError("list index out of range")))
    ckpt = byte_model(tmp_path / "model")
    task = two_label_task(tmp_path / "task")
    out = tmp_path / "out"
    line = a_bug(capsys, out / "logs" / "error.log", "eval", "icl", "--checkpoint", ckpt, "--task", task,
                 "--shots", "0", "--out", out)
    assert line.startswith("evalm eval icl: bug: IndexError: list index out of range")


# ---------------------------------------------------------------- evalm data


def test_data_mistakes_are_one_line(capsys, tmp_path):
    line = one_line(capsys, "data", "filter", "--input", tmp_path / "nope", "--output", tmp_path / "out")
    assert line == f"evalm data filter: error: {tmp_path / 'nope'}: input not found"
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"text": "hello world"}\n')
    line = one_line(capsys, "data", "filter", "--input", tmp_path / "in", "--output", tmp_path / "out", "--tasks", "0")
    assert line == "evalm data filter: error: --tasks must be >= 1"


def test_a_data_bug_names_the_log_in_its_output_folder(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("evalm.data_pipeline.cli.record_settings", _broken(ValueError("invalid literal for int()")))
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text('{"text": "hello world"}\n')
    out = tmp_path / "out"
    line = a_bug(capsys, out / "logs" / "error.log", "data", "filter", "--input", tmp_path / "in", "--output", out)
    assert line.startswith("evalm data filter: bug: ValueError: invalid literal for int()")


# ---------------------------------------------------------------- evalm train and export


def test_train_mistakes_are_one_line(capsys, tmp_path):
    line = one_line(capsys, "train", "pretrain", "--set", "train.bogus=1", "--out", tmp_path / "run")
    assert "[train]: unknown key(s) ['bogus']" in line
    run_file = tiny_run_file(tmp_path / "run.toml", tmp_path / "no-shards")
    line = one_line(capsys, "train", "pretrain", "--config", run_file, "--out", tmp_path / "run")
    assert line.startswith(f"evalm train pretrain: error: {tmp_path / 'no-shards'}") and "evalm train tokenizer" in line
    line = one_line(capsys, "train", "msit-data", "--out", tmp_path / "m.jsonl", "--inputs", "1,2")
    assert "every rule size must lie in 2..26" in line


def test_a_training_bug_names_the_log_in_its_run_folder(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("evalm.train.trainer.make_optimizer",
                        _broken(ValueError("optimizer got an empty parameter list")))
    write_shards(tmp_path / "tokens")
    run_file = tiny_run_file(tmp_path / "run.toml", tmp_path / "tokens", steps=2)
    out = tmp_path / "run"
    line = a_bug(capsys, out / "logs" / "error.log", "train", "pretrain", "--config", run_file, "--out", out)
    assert line.startswith("evalm train pretrain: bug: ValueError: optimizer got an empty parameter list")


def test_an_export_bug_is_a_bug(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("evalm.train.export.save_model", _broken(KeyError("lm_head.weight")))
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    write_shards(tmp_path / "tokens")
    run_file = tiny_run_file(tmp_path / "run.toml", tmp_path / "tokens", steps=2)
    assert evalm(capsys, "train", "pretrain", "--config", run_file, "--out", tmp_path / "run")[0] == 0
    line = one_line(capsys, "export", "--checkpoint", tmp_path / "nope", "--out", tmp_path / "model")
    assert line.startswith(f"evalm export: error: {tmp_path / 'nope'}: neither a complete checkpoint")
    out = tmp_path / "model"
    line = a_bug(capsys, out / "logs" / "error.log", "export", "--checkpoint", tmp_path / "run", "--out", out)
    assert line.startswith("evalm export: bug: KeyError: 'lm_head.weight'")


def _rank_with_a_bug(rank: int, port: int, argv: list[str]) -> None:
    """One of 2 gloo ranks of `evalm train pretrain` (as torchrun starts them) whose optimizer
    construction fails with a plain ValueError."""
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    os.environ.pop("EVALM_DEBUG", None)
    from evalm.train import trainer
    from evalm.train.pretrain import main

    trainer.make_optimizer = _broken(ValueError(f"rank {rank}: optimizer got an empty parameter list"))
    assert main(argv) == 1


def test_each_rank_of_a_distributed_run_keeps_its_bugs_traceback_in_the_run_folder(tmp_path):
    import torch.multiprocessing as mp

    write_shards(tmp_path / "tokens")
    run_file = tiny_run_file(tmp_path / "run.toml", tmp_path / "tokens", steps=2)
    out = tmp_path / "run"
    mp.spawn(_rank_with_a_bug, args=(free_port(), ["--config", str(run_file), "--out", str(out)]), nprocs=2, join=True)
    for rank, name in ((0, "error.log"), (1, "error-rank1.log")):
        trace = (out / "logs" / name).read_text()
        assert trace.startswith("Traceback") and f"ValueError: rank {rank}: optimizer got an empty" in trace


# ---------------------------------------------------------------- evalm run


def _run_file(tmp_path, extra: str = "") -> str:
    path = tmp_path / "run.toml"
    path.write_text(f'[run]\nname = "r"\nroot = "{tmp_path}"\n{extra}')
    return str(path)


def test_a_run_mistake_is_one_line(tmp_path, capsys):
    line = one_line(capsys, "run", _run_file(tmp_path, "[bogus]\n"))
    assert line.startswith("evalm run: error: ") and "unknown section(s) ['bogus']" in line


def test_a_run_bug_is_reported_as_one_with_its_traceback_kept(tmp_path, capsys, monkeypatch):
    def broken(r):  # a fault injected where the run's own code would fail, inside the held run folder
        return {}["missing"]

    monkeypatch.setattr(launcher_run, "ensure_samples", broken)
    log = tmp_path / "r" / "logs" / "error.log"
    line = a_bug(capsys, log, "run", _run_file(tmp_path))
    assert line.startswith("evalm run: bug: KeyError: 'missing'")
    assert "in broken" in log.read_text()
