"""Inputs without bounds: each once hung or took all memory; now each is refused
in one line naming the file, within a memory cap and a time limit, and nothing is left running.

Every command runs in its own process under `tests.hostile.limits` (3 GiB of address space), so the
code before the fixes fails these tests with a MemoryError, a SIGSEGV or a timeout instead of taking
the machine down.

    python -m pytest tests/hostile/test_bounds.py -q
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zstandard
from safetensors.torch import load_file, save_file

from tests.hostile.conftest import wait_for
from tests.hostile.limits import GiB, REPO, end_group, evalm, user_error

PILE_LINE = json.dumps({"text": "the quick brown fox jumps over the lazy dog " * 20,
                        "meta": {"pile_set_name": "Pile-CC"}}) + "\n"


def one_gib_line(path: Path, after: str = PILE_LINE) -> Path:
    """About 33 KB of zstd (one frame of 64 MiB of `a`, repeated) that expands to a 1 GiB line, then `after`."""
    c = zstandard.ZstdCompressor(level=3)
    path.write_bytes(c.compress(b'{"text": "') + c.compress(b"a" * (64 << 20)) * 16 + c.compress(b'"}\n')
                     + c.compress(after.encode()))
    return path


def test_lines_never_hold_a_line_past_the_limit():
    from evalm.storage.streams import LongLine, lines

    blocks = [b"ab\ncd", b"efgh", b"ijk\n", b"\nlast"]
    got = list(lines(iter(blocks), max_bytes=5))
    # the head is what was held when the line passed the limit (HEAD_BYTES of a real, 256 MiB limit)
    assert got == [b"ab", LongLine(b"cdefgh", 9), b"", b"last"]
    assert list(lines(iter([b"x\n"]), max_bytes=5)) == [b"x"]


def test_a_small_zst_expanding_to_a_1_gib_line_is_a_bad_record_not_a_crash(tmp_path):
    (tmp_path / "in").mkdir()
    shard = one_gib_line(tmp_path / "in" / "bomb.jsonl.zst")
    assert shard.stat().st_size < 40_000
    # the reader's own view: the line is skipped with its length, the next one is read
    from evalm.storage.streams import LongLine, lines, zstd_blocks

    with open(shard, "rb") as f:
        got = [x.length if isinstance(x, LongLine) else json.loads(x)["text"][:9] for x in lines(zstd_blocks(f))]
    assert got == [(1 << 30) + 12, "the quick"]
    done = evalm("data", "filter", "--input", shard, "--output", tmp_path / "out", timeout=240)
    assert "exceed max_error_fraction" in user_error(done)  # 1 bad record of 2
    [error] = [json.loads(x) for x in (tmp_path / "out" / "errors" / "00000.jsonl").read_text().splitlines()]
    assert (error["file"], error["line"], error["kind"]) == ("bomb.jsonl.zst", 1, "line_too_long")
    assert error["raw_bytes"] == (1 << 30) + 12
    done = evalm("train", "tokenizer", "--input", shard, "--output", tmp_path / "tok", timeout=240)
    assert f"{shard}:1: a line of {(1 << 30) + 12} bytes" in user_error(done)


def _busy_shard(path: Path, gib: int = 4) -> Path:
    """`gib` GiB of ordinary documents in 64 MiB zstd frames: minutes of filtering for one task."""
    c = zstandard.ZstdCompressor(level=3)
    frame = c.compress(PILE_LINE.encode() * ((64 << 20) // len(PILE_LINE)))
    path.write_bytes(frame * (16 * gib))
    return path


def _descendants(pid: int) -> set[int]:
    found, pending = set(), [pid]
    while pending:
        p = pending.pop()
        try:
            children = {int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()}
        except OSError:
            continue
        found |= children
        pending += list(children)
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] not in "ZX"
    except OSError:
        return False


def _workers(pid: int) -> set[int]:
    def cmdline(p: int) -> str:
        try:
            return Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return ""

    return {p for p in _descendants(pid) if "spawn_main" in cmdline(p)}


def test_sigterm_ends_the_command_and_every_process_it_started(tmp_path):
    """`kill PID` (SIGTERM) of `evalm data filter --workers 2` while both workers filter: before, the
    command vanished and its worker pool and manager ran on; now the pool is terminated and joined,
    the manager shut down, and the command exits 143."""
    (tmp_path / "in").mkdir()
    for name in ("a", "b"):
        _busy_shard(tmp_path / "in" / f"{name}.jsonl.zst")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "evalm.launcher.cli", "data", "filter", "--input",
                             str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--tasks", "2", "--workers", "2"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        wait_for(lambda: len(_workers(proc.pid)) == 2 or proc.poll() is not None, 120)
        time.sleep(3)  # both workers inside their task
        started = _descendants(proc.pid)
        assert proc.poll() is None and len(_workers(proc.pid)) == 2, proc.stderr.read()[-2000:]
        proc.send_signal(signal.SIGTERM)  # this process only, as `kill PID` does
        proc.wait(timeout=90)
        wait_for(lambda: not any(_alive(p) for p in started), 30)
        assert proc.returncode == 128 + signal.SIGTERM
        assert "Traceback" not in proc.stderr.read()
    finally:
        end_group(proc.pid)
        proc.wait(timeout=30)


def test_table5_on_a_few_documents_is_refused_saying_what_to_do(tmp_path):
    """The default budgets (Table 5, billions of tokens) over 39 documents: millions of copies of each
    (a MemoryError before); now refused before any copy, naming the subset and `relative = true`."""
    (tmp_path / "in").mkdir()
    subsets = ("Pile-CC", "Books3", "Wikipedia (en)")
    (tmp_path / "in" / "a.jsonl").write_text("".join(
        json.dumps({"text": f"word {i} " * 200, "meta": {"pile_set_name": subsets[i % 3]}}) + "\n" for i in range(39)))
    line = user_error(evalm("data", "blend", "--input", tmp_path / "in", "--output", tmp_path / "out", timeout=240))
    assert "would repeat each of its 13 documents" in line and "max_epochs = 100" in line
    assert "relative = true" in line
    budgets = tmp_path / "relative.toml"
    budgets.write_text((REPO / "data_pipeline" / "budgets" / "table5.toml").read_text()
                       .replace("relative = false", "relative = true"))
    done = evalm("data", "blend", "--input", tmp_path / "in", "--output", tmp_path / "rel", "--budgets", budgets,
                 timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]


def _task(folder: Path, template: str) -> Path:
    from tests.models import two_label_task

    path = two_label_task(folder)
    path.write_text(path.read_text().replace('"{text} {label}"', json.dumps(template)))
    return path


def test_a_template_width_spec_is_refused_where_the_task_is_read(tmp_path, byte_model):
    """`{text:>300000000}` padded every item to 300 million characters before anything was scored."""
    task = _task(tmp_path / "task", "{text:>300000000} {label}")
    line = user_error(evalm("eval", "icl", "--checkpoint", byte_model, "--task", task, "--shots", "0",
                            "--seeds", "1", "--methods", "concat", "--out", tmp_path / "out", timeout=240))
    assert f"{task}:1: template" in line and "{text:>300000000} is not a field name" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["fifo", *(pytest.param(k, marks=pytest.mark.slow)  # ~12 s each on 2 cores
                                             for k in ("dev-zero-txt", "dev-zero-jsonl"))])
def test_books_are_regular_files_only(tmp_path, byte_model, kind):
    """A FIFO blocks the read forever; a link to /dev/zero never ends and fills memory."""
    books = tmp_path / "books"
    books.mkdir()
    (books / "fine.txt").write_text("word " * 300)
    if kind == "fifo":
        os.mkfifo(books / "pipe.txt")
        bad, source = books / "pipe.txt", books
    else:
        bad = books / ("zero.txt" if kind == "dev-zero-txt" else "zero.jsonl")
        bad.symlink_to("/dev/zero")
        source = books if kind == "dev-zero-txt" else bad
    line = user_error(evalm("eval", "ppl", "--checkpoint", byte_model, "--books", source, "--lengths", "64",
                            "--out", tmp_path / "out", memory=3 * GiB, timeout=120))
    assert f"{bad}: " in line and "not a regular file; --books reads regular files only" in line


def test_a_billion_layers_in_config_json_is_refused_before_the_model_is_built(tmp_path, byte_model, two_label_task):
    """config.json and the weights' own record both edited to n_layer = 10^9: before, the model was
    built (on the meta device: 10^9 modules, hours and all memory) before any check could fail; now
    the header's tensors (one block) refuse it at once."""
    import shutil

    folder = Path(shutil.copytree(byte_model, tmp_path / "model"))
    config = json.loads((folder / "config.json").read_text())
    config["model"]["n_layer"] = 1_000_000_000
    (folder / "config.json").write_text(json.dumps(config))
    save_file(load_file(folder / "model.safetensors"), folder / "model.safetensors",
              metadata={"evalm.model": json.dumps(config["model"], sort_keys=True)})
    line = user_error(evalm("eval", "icl", "--checkpoint", folder, "--task", two_label_task, "--shots", "0",
                            "--seeds", "1", "--methods", "concat", "--out", tmp_path / "out", timeout=120))
    assert "n_layer 1000000000, the weights hold 1 block(s)" in line and str(folder / "config.json") in line
