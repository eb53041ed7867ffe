"""The stages as jobs: bad input recorded, kill-and-relaunch byte-identical, refusals, blend.

Run: python -m pytest tests/data_pipeline/test_jobs.py -q
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zstandard

from .conftest import pile_line, read_records, write_shard

STOP = "the of and to in a is that for it as was with be by on not he this are or his from at which".split()
CONTENT = [f"word{i}" for i in range(3000)]
SUBSETS = ["Pile-CC", "Wikipedia (en)", "Books3", "Github", "DM Mathematics"]


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(STOP) if rng.random() < 0.45 else rng.choice(CONTENT) for _ in range(n))


def _corpus(folder: Path, files: int, docs: int, seed: int = 0) -> int:
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        lines = [pile_line(_text(rng, rng.randint(5, 400)), rng.choice(SUBSETS)) for _ in range(docs)]
        write_shard(folder / f"{f:03d}.jsonl.zst", lines)
    return files * docs


def _tree(folder: Path) -> dict[str, bytes]:
    """Output files: not datatrove's logs, nor a launch's lock record and cache of input hashes."""
    from evalm.storage.run_folder import BOOKKEEPING

    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and "logs" not in p.relative_to(folder).parts and p.name not in BOOKKEEPING}


def test_bad_input_is_counted_and_written_with_file_and_line(tmp_path, run_cli):
    folder = tmp_path / "in"
    folder.mkdir()
    good = [pile_line(_text(random.Random(i), 60), "Pile-CC") for i in range(6)]
    write_shard(folder / "a.jsonl", [good[0], b"{not json", b'{"meta": {"pile_set_name": "Pile-CC"}}',
                                      b'{"text": "caf\xe9 latin-1"}', b"[1, 2]", good[1]])
    full = zstandard.ZstdCompressor().compress(b"".join(g + b"\n" for g in good[2:] * 200))
    (folder / "b.jsonl.zst").write_bytes(full[: len(full) // 2])  # truncated compressed stream
    write_shard(folder / "c.jsonl.gz", good[:2])
    (folder / "d.jsonl.gz").write_bytes((folder / "c.jsonl.gz").read_bytes()[:-10])  # truncated gzip
    config = tmp_path / "data.toml"
    config.write_text("[filter]\nmax_error_fraction = 0.9\n")
    out = tmp_path / "out"
    assert run_cli("filter", "--input", folder, "--output", out, "--config", config) == 0
    errors = read_records(out / "errors")
    kinds = {(e["file"], e["line"], e["kind"]) for e in errors}
    assert {("a.jsonl", 2, "invalid_json"), ("a.jsonl", 3, "missing_text"),
            ("a.jsonl", 4, "undecodable_bytes"), ("a.jsonl", 5, "not_an_object")} <= kinds
    assert any(f == "b.jsonl.zst" and k == "truncated_file" for f, _, k in kinds)
    assert any(f == "d.jsonl.gz" and k == "truncated_file" for f, _, k in kinds)
    manifest = json.loads((out / "manifest.json").read_text())
    stats = manifest["stats"]
    processed = sum(stats["documents_in"].values())
    assert processed == len(read_records(out / "documents")) + len(read_records(out / "rejected"))
    assert stats["errors"] == len(errors) == 6
    assert processed >= 2 + 2  # a.jsonl's two good lines and c.jsonl.gz went through


def test_error_fraction_exceeded_fails_the_task_loudly(tmp_path, run_cli, capsys):
    folder = tmp_path / "in"
    folder.mkdir()
    write_shard(folder / "a.jsonl", [b"{bad"] * 3 + [pile_line(_text(random.Random(1), 50), "Pile-CC")])
    assert run_cli("filter", "--input", folder, "--output", tmp_path / "out") == 2
    err = capsys.readouterr().err
    assert "max_error_fraction" in err and "errors/00000.jsonl" in err
    assert len(read_records(tmp_path / "out" / "errors")) == 3  # written before failing
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_changed_task_count_or_config_is_refused(tmp_path, run_cli, capsys):
    _corpus(tmp_path / "in", 2, 20)
    out = tmp_path / "out"
    assert run_cli("filter", "--input", tmp_path / "in", "--output", out, "--tasks", 2) == 0
    assert run_cli("filter", "--input", tmp_path / "in", "--output", out, "--tasks", 2) == 0  # same: fine
    assert run_cli("filter", "--input", tmp_path / "in", "--output", out, "--tasks", 3) == 2
    assert "tasks: recorded 2, now 3" in capsys.readouterr().err
    config = tmp_path / "data.toml"
    config.write_text("[filter.default]\nmin_words = 5\n")
    assert run_cli("filter", "--input", tmp_path / "in", "--output", out, "--tasks", 2, "--config", config) == 2
    assert "config" in capsys.readouterr().err


def test_parquet_input(tmp_path, run_cli):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(2)
    texts = [_text(rng, 80) for _ in range(10)]
    table = pa.table({"text": texts, "meta": [{"pile_set_name": "Books3"}] * 10})
    (tmp_path / "in").mkdir()
    pq.write_table(table, tmp_path / "in" / "x.parquet")
    assert run_cli("filter", "--input", tmp_path / "in" / "x.parquet", "--output", tmp_path / "out") == 0
    records = read_records(tmp_path / "out" / "documents") + read_records(tmp_path / "out" / "rejected")
    assert sorted(r["text"] for r in records) == sorted(texts)
    assert {r["metadata"]["pile_set_name"] for r in records} == {"Books3"}


def test_killed_task_relaunched_gives_byte_identical_outputs(tmp_path):
    _corpus(tmp_path / "in", 6, 250, seed=3)
    cmd = [sys.executable, "-m", "evalm.data_pipeline.cli", "filter", "--input", str(tmp_path / "in"), "--tasks", "6"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    subprocess.run(cmd + ["--output", str(tmp_path / "whole")], check=True, env=env, capture_output=True)

    out = tmp_path / "killed"
    proc = subprocess.Popen(cmd + ["--output", str(out)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    markers = out / "logs" / "filter" / "completions"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (markers.is_dir() and any(markers.iterdir())):
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)  # our own child's process group only
    proc.wait()
    done = sorted(p.name for p in markers.iterdir())
    assert 1 <= len(done) < 6, "the kill must land midway"
    assert not (out / "manifest.json").exists()
    mtimes = {p.name: p.stat().st_mtime_ns for p in markers.iterdir()}

    subprocess.run(cmd + ["--output", str(out)], check=True, env=env, capture_output=True)
    assert all((markers / n).stat().st_mtime_ns == t for n, t in mtimes.items()), "done tasks were rerun"
    assert _tree(out) == _tree(tmp_path / "whole")


def test_blend_budgets_report_and_heterogeneous_shards(tmp_path, run_cli):
    rng = random.Random(4)
    folder = tmp_path / "in"
    folder.mkdir()
    lines = [pile_line(_text(rng, 100), s) for s in ("Pile-CC", "Wikipedia (en)", "Books3") for _ in range(30)]
    write_shard(folder / "a.jsonl.zst", lines)
    # every document here has ~ 100 words, ~600 bytes, ~150 tokens at 4 bytes per token
    budgets = tmp_path / "budgets.toml"
    budgets.write_text('unit = 1\n[tokens]\n"Pile-CC" = 2000\n"Wikipedia (en)" = 9000\n"Books3" = 0\n')
    out = tmp_path / "out"
    assert run_cli("blend", "--input", folder, "--output", out, "--budgets", budgets, "--tasks", 3) == 0
    report = json.loads((out / "blend_report.json").read_text())["subsets"]
    available = report["Wikipedia (en)"]["available_tokens"]
    assert 9000 <= report["Wikipedia (en)"]["actual_tokens"] < 9000 + 300
    assert report["Wikipedia (en)"]["epochs"] == pytest.approx(report["Wikipedia (en)"]["actual_tokens"] / available)
    assert report["Wikipedia (en)"]["epochs"] > 1  # up-sampled
    assert 2000 <= report["Pile-CC"]["actual_tokens"] < 2000 + 300 and report["Pile-CC"]["epochs"] < 1
    assert report["Books3"]["actual_tokens"] == 0
    shards = [read_records(out / "documents")]
    per_shard = [read_records_file(p) for p in sorted((out / "documents").iterdir())]
    assert len(per_shard) == 3
    for shard in per_shard:
        assert {r["metadata"]["pile_set_name"] for r in shard} == {"Pile-CC", "Wikipedia (en)"}
    assert sum(map(len, per_shard)) == len(shards[0])
    # the same seed gives the same blend
    assert run_cli("blend", "--input", folder, "--output", tmp_path / "again", "--budgets", budgets, "--tasks", 3) == 0
    assert _tree(tmp_path / "again" / "documents") == _tree(out / "documents")


def read_records_file(path: Path) -> list[dict]:
    import orjson

    raw = zstandard.ZstdDecompressor().decompressobj().decompress(path.read_bytes())
    return [orjson.loads(line) for line in raw.splitlines()]


@pytest.mark.parametrize("command", ["filter", "dedup", "blend"])
def test_each_subcommand_explains_itself(command, capsys):
    from evalm.data_pipeline.cli import COMMANDS, main

    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert COMMANDS[command].description.split()[0] in capsys.readouterr().out
    assert main([]) == 0 and main(["nope"]) == 2
