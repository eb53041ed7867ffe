"""`evalm run` tells a user's mistake (one line, exit 2) from a bug of ours (exit 1, a pointer to the
traceback it kept): a bug printed as "error: ..." would send the user to fix an input that is fine."""

from __future__ import annotations

from evalm.launcher import run as launcher_run


def _run_file(tmp_path, extra: str = "") -> str:
    path = tmp_path / "run.toml"
    path.write_text(f'[run]\nname = "r"\nroot = "{tmp_path}"\n{extra}')
    return str(path)


def test_a_users_mistake_is_one_line(tmp_path, capsys):
    assert launcher_run.main([_run_file(tmp_path, "[bogus]\n")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("evalm run: error: ") and "unknown section(s) ['bogus']" in err[0]


def test_a_bug_is_reported_as_one_with_its_traceback_kept(tmp_path, capsys, monkeypatch):
    def broken(r, start, only):  # a fault injected where a stage's code would fail
        return {}["missing"]

    monkeypatch.setattr(launcher_run, "run_all", broken)
    monkeypatch.delenv("EVALM_DEBUG", raising=False)
    assert launcher_run.main([_run_file(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    log = tmp_path / "r" / "logs" / "error.log"
    assert len(err) == 1 and "internal error (a bug, not your input" in err[0] and str(log) in err[0]
    assert "KeyError: 'missing'" in err[0]
    assert "Traceback (most recent call last)" in log.read_text() and "in broken" in log.read_text()
