"""A study run by `evalm run --config`: three real `evalm train msit-data` steps, each reading the one before.

    pytest tests/launcher/test_study.py

The oracle of a step's work is its output file (rows it must hold, its mtime when it must not be
rewritten); the oracle of the runner's bookkeeping is the marker it leaves and what it prints.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from evalm.launcher.cli import main

STUDY = """\
[study]
name = "tiny-study"
root = "{root}"
about = "three steps, each reading the one before"

[[step]]
name = "first"
run = ["train", "msit-data", "--out", "{{root}}/a.jsonl", "--episodes", "2", "--examples", "3"]

[[step]]
name = "second"
run = ["train", "msit-data", "--out", "{{root}}/b.jsonl", "--episodes", "1", "--examples", "2",
       "--instructions", "{input}"]

[[step]]
name = "third"
run = ["train", "msit-data", "--out", "{{root}}/c.jsonl", "--episodes", "{episodes}", "--examples", "2",
       "--instructions", "{{root}}/b.jsonl"]
"""


def write_study(tmp_path: Path, root: Path, input: str = "{root}/a.jsonl", episodes: int = 1, text: str = STUDY) -> Path:
    path = tmp_path / "study-tiny.toml"
    path.write_text(text.format(root=root, input=input, episodes=episodes))
    return path


def rows(path: Path) -> int:
    return len(path.read_text().splitlines())


def mtimes(root: Path) -> dict[str, int]:
    return {name: (root / name).stat().st_mtime_ns for name in ("a.jsonl", "b.jsonl", "c.jsonl")}


def age(root: Path) -> None:
    """Set every output's mtime back, so that a rewrite shows even on a coarse clock."""
    for name in ("a.jsonl", "b.jsonl", "c.jsonl"):
        os.utime(root / name, ns=(time.time_ns() - 10**10,) * 2)


@pytest.fixture
def study(tmp_path):
    root = tmp_path / "study"
    return write_study(tmp_path, root), root


def test_every_step_runs_once_then_is_skipped(study, capsys):
    path, root = study
    assert main(["run", "--config", str(path)]) == 0
    # each step's own output: 2x3 synthetic rows; 2 + those 6; 2 + those 8
    assert (rows(root / "a.jsonl"), rows(root / "b.jsonl"), rows(root / "c.jsonl")) == (6, 8, 10)
    marker = json.loads((root / "steps" / "third.done").read_text())
    assert marker["commands"] == [["train", "msit-data", "--out", f"{root}/c.jsonl", "--episodes", "1", "--examples",
                                   "2", "--instructions", f"{root}/b.jsonl"]] and len(marker["key"]) == 64
    assert "wrote" in (root / "logs" / "second.log").read_text()  # the step's own output, in its log
    assert "wrote" in capsys.readouterr().out  # and on the console
    age(root)
    before = mtimes(root)
    assert main(["run", str(path)]) == 0  # the positional form too
    assert mtimes(root) == before  # nothing rewritten
    assert capsys.readouterr().out.count("complete, skipped") == 3


def test_a_failed_step_stops_the_study_and_a_rerun_resumes(tmp_path, capsys):
    root = tmp_path / "study"
    missing = tmp_path / "later.jsonl"
    path = write_study(tmp_path, root, input=str(missing))
    assert main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "step 'second'" in err and "exited with 2" in err and str(root / "logs" / "second.log") in err
    assert (root / "steps" / "first.done").is_file() and not (root / "c.jsonl").exists()
    missing.write_text((root / "a.jsonl").read_text())
    age_a = (root / "a.jsonl").stat().st_mtime_ns
    assert main(["run", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "first: complete, skipped" in out and (root / "a.jsonl").stat().st_mtime_ns == age_a
    assert rows(root / "c.jsonl") == 10


def test_only_and_from_rerun_what_they_name(study, capsys):
    path, root = study
    assert main(["run", "--config", str(path)]) == 0
    age(root)
    old = mtimes(root)
    assert main(["run", "--config", str(path), "--only", "second"]) == 0
    new = mtimes(root)
    assert (new["a.jsonl"], new["b.jsonl"] != old["b.jsonl"], new["c.jsonl"]) == (old["a.jsonl"], True, old["c.jsonl"])
    age(root)
    old = mtimes(root)
    assert main(["run", "--config", str(path), "--from", "second"]) == 0
    new = mtimes(root)
    assert new["a.jsonl"] == old["a.jsonl"] and new["b.jsonl"] != old["b.jsonl"] and new["c.jsonl"] != old["c.jsonl"]


def test_a_changed_step_is_run_again_and_said_so(tmp_path, capsys):
    root = tmp_path / "study"
    assert main(["run", "--config", str(write_study(tmp_path, root))]) == 0
    age(root)
    old = mtimes(root)
    path = write_study(tmp_path, root, episodes=3)
    assert main(["run", "--config", str(path), "--list"]) == 0
    listed = capsys.readouterr().out
    assert "first" in listed and "changed" in listed.split("third")[1].split("\n")[0]
    assert main(["run", "--config", str(path)]) == 0
    assert "third: its settings or inputs changed; redoing it" in capsys.readouterr().out
    new = mtimes(root)
    assert new["a.jsonl"] == old["a.jsonl"] and new["b.jsonl"] == old["b.jsonl"]
    assert rows(root / "c.jsonl") == 3 * 2 + 8


def test_root_moves_the_study(study, tmp_path):
    path, root = study
    elsewhere = tmp_path / "elsewhere"
    assert main(["run", "--config", str(path), "--root", str(elsewhere)]) == 0
    assert rows(elsewhere / "c.jsonl") == 10 and not root.exists()
    moved = tmp_path / "moved"
    assert main(["run", "--config", str(path), "--set", f"study.root={moved}", "--only", "first"]) == 0
    assert rows(moved / "a.jsonl") == 6


def test_vars_set_a_studys_scale_in_one_place(tmp_path, capsys):
    """`[study.vars]`: `{name}` in a step argument is the var's value (which may name `{root}`); `--set
    study.vars.NAME=VALUE` changes it for the run; other braces stay the command's own."""
    root = tmp_path / "study"
    text = STUDY.replace('"--episodes", "{episodes}"', '"--episodes", "{{n}}"').replace(
        'about = "three steps, each reading the one before"',
        'about = "three steps"\n[study.vars]\nn = 2\nfirst = "{{root}}/a.jsonl"')
    path = write_study(tmp_path, root, input="{first}", text=text)
    assert main(["run", "--config", str(path), "--list"]) == 0
    listed = capsys.readouterr().out
    assert f"--instructions {root}/a.jsonl" in listed and "--episodes 2 " in listed
    assert main(["run", "--config", str(path), "--set", "study.vars.n=3"]) == 0
    assert rows(root / "c.jsonl") == 3 * 2 + 8  # the third step's episodes, from the var


STEP = '[[step]]\nname = "{name}"\nrun = ["train", "msit-data", "--out", "{{root}}/x.jsonl"]\n'


@pytest.mark.parametrize("extra, expected", [
    (STEP.format(name="first"), "name 'first' is given twice"),
    (STEP.format(name="Bad_Name"), "lowercase letters"),
    (STEP.format(name="x") + 'colour = "red"\n', "unknown key(s) ['colour']"),
    (STEP.format(name="x") + 'needs = ["fourth"]\n', "needs ['fourth']: no such step before this one"),
    ('[[step]]\nname = "x"\nrun = ["bake", "--cake"]\n', "'bake' is not an `evalm` command"),
    ('[[step]]\nname = "x"\nrun = ["run", "--config", "y.toml"]\n', "'run' is not an `evalm` command"),
    ('[stduy]\nname = "x"\n', "unknown section(s) ['stduy']"),
    ('[study.vars]\nRoot = "x"\n', "vars ['Root']: names are [a-z0-9_]+"),
])
def test_a_bad_study_file_is_one_line_naming_the_file(study, capsys, extra, expected):
    path, root = study
    path.write_text(path.read_text() + extra)
    assert main(["run", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(path) in err and expected in err
    assert not root.exists()  # nothing ran


def test_needs_naming_a_later_step_is_refused(study, capsys):
    path, _ = study
    text = path.read_text().replace('name = "first"\n', 'name = "first"\nneeds = ["second"]\n')
    path.write_text(text)
    assert main(["run", "--config", str(path)]) == 2
    assert "[[step]] 1 (first): needs ['second']: no such step before this one" in capsys.readouterr().err


@pytest.mark.parametrize("flags, expected", [
    (["--only", "first,fifth"], "--only ['fifth']: no such step"),
    (["--from", "zero"], "--from ['zero']: no such step"),
    (["--only", "third"], "step 'third' needs ['second'], not done"),
])
def test_a_bad_selection_is_one_line(study, capsys, flags, expected):
    path, root = study
    assert main(["run", "--config", str(path), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err
    assert not (root / "steps").exists()


def test_the_main_jobs_run_file_still_runs_as_before(capsys):
    # the same refusal from the one runner, by --config or positionally: the stage names, not steps
    for argv in (["run", "--config", "configs/tiny.toml", "--only", "nosuch"], ["run", "configs/tiny.toml", "--only", "nosuch"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "--only ['nosuch']: no such stage; valid: ['filter'" in err and len(err.strip().splitlines()) == 1


def test_only_marks_the_steps_that_read_it_stale(study, capsys):
    """The main job's rule, for studies too: `--only second` rebuilds what `third` read, so the next run
    redoes `third` (and leaves `first` alone)."""
    path, root = study
    assert main(["run", "--config", str(path)]) == 0
    assert main(["run", "--config", str(path), "--only", "second"]) == 0
    assert json.loads((root / "steps" / "third.done").read_text())["stale"] is True
    age(root)
    old = mtimes(root)
    capsys.readouterr()
    assert main(["run", "--config", str(path)]) == 0
    assert "third: marked stale by --only; redoing it" in capsys.readouterr().out
    new = mtimes(root)
    assert (new["a.jsonl"], new["b.jsonl"]) == (old["a.jsonl"], old["b.jsonl"]) and new["c.jsonl"] != old["c.jsonl"]


def test_a_study_folder_of_the_runner_before_keys_is_resumed(study, capsys):
    """A folder the study runner made before the one runner (argv markers, no folder marker) is taken as
    `evalm run`'s and its done steps are skipped, not rerun."""
    path, root = study
    assert main(["run", "--config", str(path)]) == 0
    (root / ".evalm-folder.json").unlink()
    for marker in (root / "steps").glob("*.done"):
        marker.write_text(json.dumps(json.loads(marker.read_text())["commands"][0]))
    age(root)
    before = mtimes(root)
    capsys.readouterr()
    assert main(["run", "--config", str(path)]) == 0
    assert capsys.readouterr().out.count("complete, skipped") == 3 and mtimes(root) == before


def test_the_main_job_lists_its_stages(tmp_path, capsys):
    """`--list` and `--root` for the main job too: every stage, its state and its commands; nothing made."""
    assert main(["run", "configs/tiny.toml", "--list", "--root", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert all(f"  {stage:<28} to run" in out for stage in ("filter", "pretrain", "recall"))
    assert f"--output {tmp_path / 'runs' / 'tiny' / 'filter'}" in out
    assert not (tmp_path / "runs").exists()
