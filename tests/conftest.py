"""Shared fixtures: a real redis-server, a reset torch dtype, an offline hub.

Run: python -m pytest -m "not slow" -n 2 --dist loadfile  (the README's test command; one file: python -m pytest FILE)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _isolate(tmp_path_factory, monkeypatch):
    """Reset the default dtype and keep any hub cache inside a temporary folder."""
    import torch

    monkeypatch.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf_home")))
    dtype = torch.get_default_dtype()
    yield
    torch.set_default_dtype(dtype)
    _lift_auto_class_marks()


def _lift_auto_class_marks() -> None:
    """A test that loads an evalm folder through its shim (`trust_remote_code=True`) marks evalm's own classes for
    an Auto class, and every later `save_pretrained` in that process writes an `auto_map` (evalm/hf_private.py):
    the model-folder gate then refuses the next test's folder. Lifted after each test, so the order of the files
    (pytest-xdist gives each worker its own) cannot decide a result."""
    for name in ("evalm.hf_llama", "evalm.hf_evalm"):
        module = sys.modules.get(name)
        for cls in vars(module).values() if module is not None else ():
            if isinstance(cls, type) and "_auto_class" in cls.__dict__:
                del cls._auto_class  # back to transformers' own default (None, on its base classes)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def redis_server(*options: str, password: str | None = None) -> Iterator[int]:
    """A redis-server started here on a free loopback port (its port), stopped after. Without the
    binary: skip locally, fail under CI so a missing install cannot hide."""
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed; .ci/run must install Debian's redis-server")
        pytest.skip("redis-server not on PATH (apt-get install redis-server)")
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *options,
         *(["--requirepass", password] if password else [])],
        stdout=subprocess.DEVNULL,
    )
    import redis

    client = redis.Redis(host="127.0.0.1", port=port, password=password)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def redis_url():
    """A real Redis: EVALM_REDIS_URL (set by .ci/run), else a redis-server started here. Never a mock."""
    url = os.environ.get("EVALM_REDIS_URL")
    if url:
        yield url
        return
    with redis_server() as port:
        yield f"redis://127.0.0.1:{port}/0"


LONGEST_FIRST = ("tests/launcher/test_run.py",)
"""The file that runs the main job (about 3 of the suite's 10 minutes on 2 cores): collected first, so that under
the README's `-n 2 --dist loadfile` one worker starts it while the other takes the rest, and neither waits on it
at the end."""


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in LONGEST_FIRST)  # stable: file order otherwise
