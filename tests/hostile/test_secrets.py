"""A Redis password reaches neither disk nor screen (issue "Hostile inputs, second round", item 3).

Run: python -m pytest tests/hostile/test_secrets.py -q

A real `redis-server --requirepass` is started here; `evalm data dedup --redis-url
redis://:PASSWORD@...` must connect with the password (the stage completes on that server) while
no file of its folder (config.json, manifest.json, the lock file's argv, datatrove's
logs/*/executor.json and task logs) and no console line holds it, and a wrong password is not
echoed in the refusal. `evalm run`'s stage log and stage marker, which record a stage's command
line, are checked the same way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import redis_server
from tests.hostile.conftest import REPO, one_line

PASSWORD = "s3cret-Pa55word"
WRONG = "not-the-Pa55word"


@pytest.fixture(scope="module")
def locked_redis():
    """A redis-server that requires PASSWORD: its port."""
    with redis_server(password=PASSWORD) as port:
        yield port


def _corpus(folder: Path) -> Path:
    from tests.data_pipeline.test_jobs import _corpus as write

    write(folder, 2, 30)
    return folder


def _dedup(corpus: Path, out: Path, url: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("EVALM_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "evalm.launcher.cli", "data", "dedup", "--input", str(corpus),
                           "--output", str(out), "--tasks", "2", "--redis-url", url, "--keep-index"],
                          capture_output=True, text=True, env=env, timeout=300)


def _holding(folder: Path, secret: str) -> list[str]:
    return [str(p.relative_to(folder)) for p in sorted(folder.rglob("*"))
            if p.is_file() and secret.encode() in p.read_bytes()]


@pytest.mark.redis
def test_a_redis_password_is_used_but_never_written_or_printed(tmp_path, locked_redis):
    import redis

    corpus, out = _corpus(tmp_path / "in"), tmp_path / "out"
    done = _dedup(corpus, out, f"redis://:{PASSWORD}@127.0.0.1:{locked_redis}/0")
    assert done.returncode == 0, done.stderr[-3000:]
    keys = redis.Redis(host="127.0.0.1", port=locked_redis, password=PASSWORD).keys(b"evalm:*")
    assert keys, "the index is on the password-protected server: the real URL was used to connect"
    assert PASSWORD not in done.stdout + done.stderr
    assert f"redis://:***@127.0.0.1:{locked_redis}/0" in done.stdout  # the line that names the server
    assert _holding(out, PASSWORD) == []  # was: config.json, manifest.json, .evalm.lock, logs/*/executor.json
    executor = json.loads((out / "logs" / "lsh_insert" / "executor.json").read_text())
    assert executor["pipeline"][0]["redis_url"] == f"redis://:***@127.0.0.1:{locked_redis}/0"
    assert json.loads((out / "config.json").read_text())["index"]["redis_url"].startswith("redis://:***@")
    assert "***" in (out / ".evalm.lock").read_text()


@pytest.mark.redis
def test_a_wrong_password_is_refused_without_being_echoed(tmp_path, locked_redis):
    corpus, out = _corpus(tmp_path / "in"), tmp_path / "out"
    done = _dedup(corpus, out, f"redis://:{WRONG}@127.0.0.1:{locked_redis}/0")
    assert done.returncode == 2
    line = one_line(done.stderr)
    assert f"cannot use Redis at redis://:***@127.0.0.1:{locked_redis}/0" in line, line
    assert WRONG not in done.stdout + done.stderr  # was: the refusal quoted the URL, password and all
    assert _holding(out, WRONG) == []


@pytest.mark.redis
def test_evalm_runs_stage_log_and_marker_hold_no_password(tmp_path, locked_redis):
    """`evalm run` records each stage's command line in its log (`launcher.console.call`) and marker."""
    from evalm.launcher.console import StageFailed, call
    from evalm.launcher.markers import MARKER
    from evalm.launcher.runner import write_marker
    from evalm.launcher.run_file import load_run

    corpus = _corpus(tmp_path / "in")
    log = tmp_path / "logs" / "dedup.log"
    argv = ["data", "dedup", "--input", str(corpus), "--output", str(tmp_path / "dedup"),
            "--redis-url", f"redis://:{WRONG}@127.0.0.1:{locked_redis}/0"]
    with pytest.raises(StageFailed) as failed:
        call(argv, log)
    assert WRONG not in str(failed.value) and "redis://:***@" in str(failed.value)
    assert WRONG not in log.read_text() and "--redis-url redis://:***@" in log.read_text()
    run_file = tmp_path / "run.toml"
    run_file.write_text(f'[run]\nname = "r"\nroot = "{tmp_path}"\n')
    r = load_run(run_file)
    r.stage_dir("dedup").mkdir(parents=True)
    write_marker(r.stage_dir("dedup") / MARKER, {"stage": "dedup", "key": "k", "commands": [argv], "seconds": 1.0})
    marker = (r.stage_dir("dedup") / ".evalm-stage.json").read_text()
    assert WRONG not in marker and "redis://:***@" in marker


SPECIAL = "p@ss:w0rd/Secr%t"
"""A password with the characters a URL must percent-encode (`p%40ss%3Aw0rd%2FSecr%25t` in one)."""


@pytest.fixture(scope="module")
def special_redis():
    """A redis-server whose password needs percent-encoding in a URL: its port."""
    with redis_server(password=SPECIAL) as port:
        yield port


@pytest.mark.redis
@pytest.mark.parametrize("spelling", ["query", "user-query", "percent-encoded"])
def test_every_spelling_of_a_redis_password_is_used_but_never_written_or_printed(tmp_path, special_redis, spelling):
    """Issue "Hostile inputs, third round", item 4: `redis://alice@host/0?password=...` (a user without a
    password, the password as a query parameter) and a percent-encoded password reached the console,
    config.json, manifest.json, .evalm.lock and the executor logs; only `user:PASSWORD@` was masked."""
    from urllib.parse import quote

    import redis

    encoded = quote(SPECIAL, safe="")
    url = {"query": f"redis://127.0.0.1:{special_redis}/0?password={encoded}",
           "user-query": f"redis://default@127.0.0.1:{special_redis}/0?password={encoded}",
           "percent-encoded": f"redis://:{encoded}@127.0.0.1:{special_redis}/0"}[spelling]
    corpus, out = _corpus(tmp_path / "in"), tmp_path / "out"
    done = _dedup(corpus, out, url)
    assert done.returncode == 0, done.stderr[-3000:]
    keys = redis.Redis(host="127.0.0.1", port=special_redis, password=SPECIAL).keys(b"evalm:*")
    assert keys, "the index is on the password-protected server: the real URL was used to connect"
    for secret in (SPECIAL, encoded, "w0rd"):
        assert secret not in done.stdout + done.stderr, secret
        assert _holding(out, secret) == [], secret  # was: config.json, manifest.json, .evalm.lock, 7 executor logs
    assert "***" in (out / ".evalm.lock").read_text()
    assert "***" in json.loads((out / "config.json").read_text())["index"]["redis_url"]


def test_redact_masks_each_spelling_and_keeps_the_rest():
    from evalm.storage import Secret, redact

    cases = {
        "redis://:pw1234@h:6379/0": "redis://:***@h:6379/0",
        "rediss://alice:pw1234@h/0": "rediss://alice:***@h/0",
        "redis://alice@h/0?password=pw1234&db=2": "redis://alice@h/0?password=***&db=2",
        "redis://:p%40ss%3Aw@h/0": "redis://:***@h/0",
        "redis://:p@ss@h/0": "redis://:***@h/0",  # a raw @ in the password: the host is after the last one
        "see redis%3A%2F%2F%3Apw1234%40h%3A1%2F0": "see redis%3A%2F%2F%3A***%40h%3A1%2F0",
        "redis%3A%2F%2Fh%2F0%3Fpassword%3Dpw1234": "redis%3A%2F%2Fh%2F0%3Fpassword%3D***",
        "redis://h:6379/0": "redis://h:6379/0",
    }
    for text, shown in cases.items():
        assert redact(text) == shown, text
    Secret("redis://:Decoded%40Pass@h/0")  # a library printing the password decoded, outside any URL
    assert redact("AUTH failed for Decoded@Pass") == "AUTH failed for ***"
