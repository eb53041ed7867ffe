"""The schedule of `evalm run`: its steps one after another in this process, or several at once.

`[run] jobs = 1` runs each step in this process, in stage order (`console.call`: its lines to its
log, progress bars on screen). With more jobs, each step runs as a child process, the same command a
user runs (`evalm ARGV`, launcher.cli's main), up to `jobs` at once, each started as soon as every
step it reads from is done (`Step.needs`), the earliest in stage order first. Why: a tiny model uses a
second thread poorly (msit: 1.25x the tokens/s of one thread on 2 cores, 26 Nov, AMD EPYC), so two
one-thread steps side by side do more work per second than two threads on one step. Each child gets
`cores // jobs` threads (OMP_NUM_THREADS, unless the caller set it), a number fixed by the run file and
the machine, never by what happened to run beside it: a step's floats do not depend on the schedule.

A failed step stops the schedule: no step starts after it, the ones running beside it are interrupted
(one SIGINT: a training step keeps its last complete checkpoint, an evaluation its finished units)
and waited for, and the failure is raised as `console.call` raises it. Ctrl-C does the same and
raises KeyboardInterrupt; a rerun resumes every interrupted step.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from evalm.launcher.console import check_exit, log_header
from evalm.launcher.runner import Step
from evalm.storage.files import appended

POLL_SECONDS = 0.2
CHILD = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
         "from evalm.launcher.cli import main; sys.exit(main(sys.argv[1:]))")
"""A step's process: `evalm ARGV`, with Python's own Ctrl-C handler whatever it inherited. A shell without
job control starts `evalm run &` with SIGINT ignored, and an ignored signal stays ignored in every child
(a Python started so never raises KeyboardInterrupt), so a step beside a failed one ran to its end."""
STATUS_SECONDS = 1.0


def cores() -> int:
    """CPUs this process may run on (its affinity mask: a Slurm or taskset share, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def child_environment(jobs: int) -> dict[str, str]:
    """The environment of every child step: `cores() // jobs` threads each, unless the caller chose a
    number; progress bars refreshed every few seconds (they go to the step's log, not a terminal)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, cores() // jobs)))
    env.setdefault("TQDM_MININTERVAL", "5")
    return env


def run_steps(steps: Sequence[Step], jobs: int, log_of: Callable[[Step], Path],
              started: Callable[[Step], None], finished: Callable[[Step, float], None]) -> None:
    """Run `steps` (in stage order; a need outside them counts as done), calling `started` before a step
    and `finished` with its seconds after it succeeds."""
    if jobs == 1:
        from evalm.launcher.console import call

        for step in steps:
            started(step)
            t0 = time.perf_counter()
            call(step.argv, log_of(step), step.name)
            finished(step, time.perf_counter() - t0)
        return
    _Pool(steps, jobs, log_of, started, finished).run()


def run_teed(steps: Sequence[Step], log_of: Callable[[Step], Path], started: Callable[[Step], None],
             finished: Callable[[Step, float], None]) -> None:
    """`steps` one after another (a study's), each a child process (`CHILD`: a GPU's memory is freed when it
    ends) whose lines go to the console and to its log; a failed step stops them, naming the step and its log."""
    for step in steps:
        started(step)
        t0, log = time.perf_counter(), log_of(step)
        with appended(log) as f:  # never through a link, nor into a file with another name (a hard link)
            f.write(log_header(step.record()))
            f.flush()
            proc = subprocess.Popen([sys.executable, "-c", CHILD, *step.argv], stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
            try:
                for line in proc.stdout:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                    f.write(line)
            except KeyboardInterrupt:  # the child got the same Ctrl-C (same process group): let it stop cleanly
                proc.wait()
                raise
            code = proc.wait()
        check_exit(code, step.record(), log, step.name)
        finished(step, time.perf_counter() - t0)


class _Pool:
    """Child processes, at most `jobs` at once, started in stage order as their needs are met."""

    def __init__(self, steps, jobs, log_of, started, finished):
        self.pending = list(steps)
        self.names = {s.name for s in steps}
        self.jobs, self.log_of, self.started, self.finished = jobs, log_of, started, finished
        self.running: dict[subprocess.Popen, tuple[Step, float]] = {}
        self.done: set[str] = set()
        self.env = child_environment(jobs)
        self.status = _Status(len(self.pending))

    def run(self) -> None:
        failure = None
        try:
            while self.pending or self.running:
                if failure is None:
                    self._start_ready()
                if not self.running:
                    break  # after a failure; or needs that can never be met (a bug in the stage table)
                proc, step, seconds = self._wait_one()
                if proc.returncode == 0:
                    self.done.add(step.name)
                    self.status.clear()
                    self.finished(step, seconds)
                elif failure is None:
                    failure = (step, proc.returncode)
                    self._interrupt()
        except BaseException:  # Ctrl-C, or an error of ours between steps (a marker that cannot be written)
            self._interrupt()
            self._wait_all()
            raise
        finally:
            self.status.clear()
        if failure is not None:
            step, code = failure
            check_exit(code, step.record(), self.log_of(step), step.name)
        if self.pending:
            raise RuntimeError(f"steps whose needs were never met: {[s.name for s in self.pending]}")

    def _ready(self) -> Step | None:
        return next((s for s in self.pending if all(n in self.done or n not in self.names for n in s.needs)), None)

    def _start_ready(self) -> None:
        while len(self.running) < self.jobs and (step := self._ready()) is not None:
            self.pending.remove(step)
            self.status.clear()
            self.started(step)
            log = self.log_of(step)
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("a", encoding="utf-8") as f:
                f.write(log_header(step.record()))
                f.flush()
                # its own session: Ctrl-C reaches the children once, forwarded by _interrupt, not twice
                proc = subprocess.Popen([sys.executable, "-c", CHILD, *step.argv], stdin=subprocess.DEVNULL,
                                        stdout=f, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
            self.running[proc] = (step, time.perf_counter())

    def _wait_one(self) -> tuple[subprocess.Popen, Step, float]:
        while True:
            ended = next((proc for proc in self.running if proc.poll() is not None), None)
            if ended is not None:
                step, t0 = self.running.pop(ended)
                return ended, step, time.perf_counter() - t0
            self.status.show(self.running.values(), len(self.done))
            time.sleep(POLL_SECONDS)

    def _interrupt(self) -> None:
        for proc in self.running:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)

    def _wait_all(self) -> None:
        for proc in list(self.running):
            proc.wait()
        self.running.clear()


class _Status:
    """One line on a terminal, rewritten each second: the running steps and their minutes (nothing when
    stderr is not a terminal: the stage lines and the logs say it all)."""

    def __init__(self, total: int):
        self.total, self.shown, self.last = total, False, 0.0
        self.tty = sys.stderr.isatty()
        self.t0 = time.perf_counter()

    def show(self, running, done: int) -> None:
        now = time.perf_counter()
        if not self.tty or now - self.last < STATUS_SECONDS:
            return
        self.last = now
        parts = ", ".join(f"{step.name} {_clock(now - t0)}" for step, t0 in running)
        sys.stderr.write(f"\r\033[K[{_clock(now - self.t0)}] {done}/{self.total} steps done; running: {parts}")
        sys.stderr.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self.shown = False


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"
