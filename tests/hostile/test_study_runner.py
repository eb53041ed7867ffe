"""Hostile inputs to the study runner (`evalm run --config STUDY.toml`): its folder, its records, its file.

    pytest tests/hostile/test_study_runner.py

The steps are real `evalm train msit-data` commands (a second each); the oracles are the files a step must
not touch, the text a record must not hold, and the one-line refusals.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from evalm.launcher.cli import main

STEP = '''
[[step]]
name = "{name}"
run = ["train", "msit-data", "--out", "{out}", "--episodes", "{episodes}", "--examples", "2"{extra}]
{needs}'''


def study(tmp_path: Path, root: Path | str, steps: str, head: str = "") -> Path:
    path = tmp_path / "study.toml"
    path.write_text(f'[study]\nname = "hostile"\nroot = "{root}"\n{head}\n{steps}')
    return path


def step(name: str, out: str = "", episodes: str = "1", extra: str = "", needs: str = "") -> str:
    return STEP.format(name=name, out=out or f"{{root}}/{name}.jsonl", episodes=episodes, extra=extra,
                       needs=f"needs = {needs}\n" if needs else "")


def refused(capsys, argv: list[str], *expected: str) -> str:
    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert all(e in err for e in expected), err
    return err


@pytest.mark.parametrize("sub, name", [("steps", "first.done"), ("logs", "first.log")])
def test_a_linked_steps_or_logs_folder_is_refused_not_written_through(tmp_path, capsys, sub, name):
    """A study folder of ours whose `steps/` or `logs/` was replaced by a link: a rerun deleted the marker in
    the link's target and wrote a new one there, or appended its log there."""
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    path = study(tmp_path, root, step("first"))
    assert main(["run", "--config", str(path)]) == 0
    shutil.rmtree(root / sub)
    elsewhere.mkdir()
    (elsewhere / name).write_text("mine\n")  # a file of the link's target: never deleted nor grown
    (root / sub).symlink_to(elsewhere)
    capsys.readouterr()
    refused(capsys, ["--config", str(path), "--only", "first"], f"{root / sub} is a symbolic link")
    assert sorted(p.name for p in elsewhere.iterdir()) == [name] and (elsewhere / name).read_text() == "mine\n"


def test_a_hard_linked_step_log_is_refused_not_appended_into_the_other_file(tmp_path, capsys):
    root, other = tmp_path / "root", tmp_path / "precious.txt"
    path = study(tmp_path, root, step("first"))
    assert main(["run", "--config", str(path)]) == 0
    other.write_text("mine\n")
    (root / "logs" / "first.log").unlink()
    os.link(other, root / "logs" / "first.log")
    capsys.readouterr()
    refused(capsys, ["--config", str(path), "--only", "first"], str(root / "logs" / "first.log"), "hard link")
    assert other.read_text() == "mine\n"


SECRET = "98765432101"


def test_a_secret_looking_var_is_recorded_nowhere(tmp_path, capsys, monkeypatch):
    """A var named like a credential, set on the command line and used in a step: the lock, the step's marker,
    its log's command line, the console and `--list` hold `***`, never the value."""
    root = tmp_path / "root"
    path = study(tmp_path, root, step("first", extra=', "--seed", "{api_token}"'), head='[study.vars]\napi_token = 1\n')
    argv = ["run", "--config", str(path), "--set", f"study.vars.api_token={SECRET}"]
    monkeypatch.setattr(sys, "argv", ["evalm", *argv])  # what the lock records: the command line
    assert main(argv) == 0
    assert main(["run", "--config", str(path), "--set", f"study.vars.api_token={SECRET}", "--list"]) == 0
    shown = capsys.readouterr()
    assert SECRET not in shown.out + shown.err and "--seed ***" in shown.out
    records = [root / ".evalm.lock", root / "steps" / "first.done", root / "logs" / "first.log"]
    for record in records:
        assert SECRET not in record.read_text(), record
    assert "study.vars.api_token=***" in (root / ".evalm.lock").read_text()
    assert "--seed ***" in (root / "logs" / "first.log").read_text()


def test_a_var_holding_a_url_with_a_password_is_masked_in_the_list(tmp_path, capsys):
    path = study(tmp_path, tmp_path / "root", step("first", extra=', "--seed", "{source}"'),
                 head='[study.vars]\nsource = "https://user:hunter2pass@example.org/x"\n')
    assert main(["run", "--config", str(path), "--list"]) == 0
    out = capsys.readouterr().out
    assert "hunter2pass" not in out and "--seed ***" in out


def test_an_empty_root_is_refused(tmp_path, capsys, monkeypatch):
    """`--root ""` made every `{root}/x` the absolute `/x` (and the folder the working one)."""
    monkeypatch.chdir(tmp_path)
    path = study(tmp_path, tmp_path / "root", step("first", out="{root}first.jsonl"))
    refused(capsys, ["--config", str(path), "--root", ""], "--root is empty")
    refused(capsys, ["--config", str(path), "--set", 'study.root=""'], "root is empty")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.toml"]


@pytest.mark.parametrize("maker", [None, "evalm train pretrain"])
def test_a_root_another_command_made_or_a_model_folder_is_refused(tmp_path, capsys, maker):
    root = tmp_path / "model"
    root.mkdir()
    (root / "config.json").write_text('{"model_type": "llama"}')
    if maker:
        (root / ".evalm-folder.json").write_text(json.dumps({"command": maker}))
    path = study(tmp_path, root, step("first"))
    refused(capsys, ["--config", str(path)], f"`evalm run` writes only into a folder it made or an empty one, and {root}")
    assert sorted(p.name for p in root.iterdir() if p.name != ".evalm.lock") == \
        sorted(["config.json", *([".evalm-folder.json"] if maker else [])])
    assert (root / "config.json").read_text() == '{"model_type": "llama"}'


def test_two_steps_writing_one_output_are_refused_naming_both(tmp_path, capsys):
    path = study(tmp_path, tmp_path / "root", step("first", out="{root}/x.jsonl") + step("second", out="{root}/./x.jsonl"))
    refused(capsys, ["--config", str(path)], "steps 'first' and 'second' both write", "x.jsonl")
    assert not (tmp_path / "root").exists()


def rows(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_a_changed_step_reruns_the_steps_that_read_it(tmp_path, capsys):
    """`second` copies `first`'s rows (`--instructions`): after `first` changes, `second` must rerun."""
    root = tmp_path / "root"
    reader = step("second", extra=', "--instructions", "{root}/first.jsonl"')
    assert main(["run", "--config", str(study(tmp_path, root, step("first", episodes="1") + reader))]) == 0
    assert rows(root / "second.jsonl") == 1 * 2 + 1 * 2
    assert main(["run", "--config", str(study(tmp_path, root, step("first", episodes="3") + reader))]) == 0
    assert rows(root / "first.jsonl") == 3 * 2
    assert rows(root / "second.jsonl") == 3 * 2 + 1 * 2  # was: skipped as done, built on the old rows
    assert "second: a step it needs is redone; redoing it too" in capsys.readouterr().out


def test_an_unknown_var_is_refused_not_made_into_a_folder(tmp_path, capsys):
    path = study(tmp_path, tmp_path / "root", step("first", out="{root}/{subb}/a.jsonl"), head='[study.vars]\nsub = "x"\n')
    refused(capsys, ["--config", str(path)], "{subb}", "no var of the study", "valid: ['root', 'sub']")
    assert not (tmp_path / "root").exists()


def test_a_doubled_brace_is_the_literal_text(tmp_path, capsys):
    """The escape for a command's own braces (a template's `{label}`): `{{label}}` is `{label}`."""
    path = study(tmp_path, tmp_path / "root", step("first", out="{root}/{{label}}.jsonl"))
    assert main(["run", "--config", str(path), "--list"]) == 0
    assert f"--out {tmp_path / 'root'}/{{label}}.jsonl" in capsys.readouterr().out


@pytest.mark.parametrize("override, expected", [
    ("study.vars.sbu=2", "declares no var 'sbu' (it would be ignored); valid: ['sub']"),
    ("study.vars={}", "would replace every var"),
])
def test_a_misspelled_or_wholesale_var_override_is_refused(tmp_path, capsys, override, expected):
    path = study(tmp_path, tmp_path / "root", step("first", out="{root}/{sub}.jsonl"), head='[study.vars]\nsub = "x"\n')
    err = refused(capsys, ["--config", str(path), "--set", override], expected)
    assert err.startswith("evalm run: error: --set study.vars")
    assert not (tmp_path / "root").exists()


def _lines_run(call) -> int:
    """How many Python lines `call()` runs (sys.settrace's line events): a count of work that a loaded machine
    cannot change, unlike a clock."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        count += event == "line"
        return tracer

    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(None)
    return count


def test_a_large_study_loads_in_linear_work(tmp_path):
    """Steps each needing the one before (the default) load and list with work linear in their number: ten
    times the steps run ten times the Python lines (a loop over every step for each step's name would run a
    hundred times as many; a search inside one C call, `name in a_list`, is not counted). Counted, not timed: a
    clock on a shared 2-core machine read a linear load as 25 times slower for 10 times the steps."""
    from evalm.launcher.runner import Runner
    from evalm.launcher.study import StudyJob
    from evalm.launcher.study_file import load_study

    def lines(n: int) -> int:
        steps = "".join(f'[[step]]\nname = "s{i}"\nrun = ["train", "msit-data", "--out", "{{root}}/{i}.jsonl"]\n'
                        for i in range(n))
        path = study(tmp_path, tmp_path / "root", steps)
        out = {}

        def load() -> None:
            out["study"] = load_study(path)
            out["listing"] = Runner(StudyJob(out["study"], "evalm run")).listing()

        count = _lines_run(load)
        assert len(out["listing"].splitlines()) == n and out["study"].step(f"s{n - 1}").needs == (f"s{n - 2}",)
        return count

    small, large = lines(200), lines(2_000)
    assert large < 12 * small, (small, large)


def test_a_misspelled_set_of_the_main_job_is_named_as_the_flags_mistake(capsys):
    err = refused(capsys, ["configs/tiny.toml", "--set", "run.sede=2"], "--set run.sede=2", "unknown key(s) ['sede']")
    assert "tiny.toml" not in err
