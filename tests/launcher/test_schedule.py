"""The schedule of `evalm run`: steps as child processes, at most `jobs` at once, each after its needs.

    python -m pytest tests/launcher/test_schedule.py -q

The steps are real `evalm train msit-data` commands (a second or two each): one reads the rows
another writes, so a schedule that ignored `needs` would hand it a missing or half-written file.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from evalm.launcher.console import StageFailed
from evalm.launcher.schedule import child_environment, cores, run_steps
from evalm.launcher.stages import Step


def _rows(out: Path, episodes: int, instructions: Path | None = None) -> list[str]:
    argv = ["train", "msit-data", "--out", str(out), "--episodes", str(episodes), "--examples", "160"]
    return argv + (["--instructions", str(instructions)] if instructions else [])


class _Trace:
    """When each step started and finished (in the parent), for the order and the overlap."""

    def __init__(self, tmp: Path):
        self.tmp, self.events = tmp, []

    def log(self, step: Step) -> Path:
        return self.tmp / "logs" / f"{step.name}.log"

    def started(self, step: Step) -> None:
        self.events.append(("start", step.name, time.perf_counter()))

    def finished(self, step: Step, seconds: float) -> None:
        self.events.append(("end", step.name, time.perf_counter()))

    def at_once(self) -> int:
        most = now = 0
        for kind, _, _ in self.events:
            now += 1 if kind == "start" else -1
            most = max(most, now)
        return most

    def names(self, kind: str) -> list[str]:
        return [name for k, name, _ in self.events if k == kind]


def test_a_step_starts_after_its_needs_and_no_more_than_jobs_run_at_once(tmp_path):
    big = tmp_path / "big.jsonl"
    steps = [Step("big", _rows(big, 1500)),
             Step("side", _rows(tmp_path / "side.jsonl", 200)),
             Step("reader", _rows(tmp_path / "reader.jsonl", 0, instructions=big), needs=("big",)),
             Step("last", _rows(tmp_path / "last.jsonl", 50))]
    trace = _Trace(tmp_path)
    run_steps(steps, 2, trace.log, trace.started, trace.finished)
    assert sorted(trace.names("end")) == ["big", "last", "reader", "side"]
    assert trace.names("start").index("reader") > trace.names("end").index("big")
    order = [(k, n) for k, n, _ in trace.events]
    assert order.index(("start", "reader")) > order.index(("end", "big"))
    # every row the need wrote reached the step that reads it
    assert (tmp_path / "reader.jsonl").read_text() == big.read_text()
    assert trace.at_once() == 2  # two ran side by side, never three
    assert "$ evalm train msit-data --out" in (tmp_path / "logs" / "reader.log").read_text()


def test_a_failed_step_stops_the_schedule_and_interrupts_the_one_beside_it(tmp_path):
    # `bad` fails at the command line in a tenth of a second; `long` writes rows for ten seconds or more
    steps = [Step("long", _rows(tmp_path / "long.jsonl", 20000)),
             Step("bad", ["frobnicate", "--out", str(tmp_path / "bad.jsonl")]),
             Step("after", _rows(tmp_path / "after.jsonl", 5))]
    trace = _Trace(tmp_path)
    t0 = time.perf_counter()
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as `evalm run &` from a script inherits it
    try:
        with pytest.raises(StageFailed, match=r"exited with 2; its output is in .*bad\.log"):
            run_steps(steps, 2, trace.log, trace.started, trace.finished)
    finally:
        signal.signal(signal.SIGINT, ignored)
    assert time.perf_counter() - t0 < 60  # the long step was interrupted, not waited for to its end
    assert trace.names("start") == ["long", "bad"] and trace.names("end") == []
    assert not (tmp_path / "after.jsonl").exists()
    assert "unknown command 'frobnicate'" in (tmp_path / "logs" / "bad.log").read_text()  # its own one line, in its log


def test_one_job_runs_the_steps_in_this_process_in_order(tmp_path):
    steps = [Step("a", _rows(tmp_path / "a.jsonl", 3)), Step("b", _rows(tmp_path / "b.jsonl", 0, tmp_path / "a.jsonl"), ("a",))]
    trace = _Trace(tmp_path)
    run_steps(steps, 1, trace.log, trace.started, trace.finished)
    assert [(k, n) for k, n, _ in trace.events] == [("start", "a"), ("end", "a"), ("start", "b"), ("end", "b")]
    assert (tmp_path / "b.jsonl").read_text() == (tmp_path / "a.jsonl").read_text()


def test_children_get_an_even_share_of_the_cores_unless_the_caller_chose(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert child_environment(2)["OMP_NUM_THREADS"] == str(max(1, cores() // 2))
    assert child_environment(10 * cores())["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert child_environment(2)["OMP_NUM_THREADS"] == "3"


def test_a_child_ended_by_a_signal_is_reported_as_what_the_signal_means(tmp_path):
    """-SIGINT (a step that let Ctrl-C out) is an interruption; -SIGKILL names memory; any other signal says which."""
    from evalm.launcher.console import check_exit

    with pytest.raises(KeyboardInterrupt):
        check_exit(-signal.SIGINT, ["train", "msit"], tmp_path / "msit.log")
    with pytest.raises(StageFailed, match="killed by SIGKILL.*free memory"):
        check_exit(-signal.SIGKILL, ["train", "msit"], tmp_path / "msit.log")
    with pytest.raises(StageFailed, match="killed by SIGSEGV; its output is in .*msit.log; then rerun"):
        check_exit(-signal.SIGSEGV, ["train", "msit"], tmp_path / "msit.log")
