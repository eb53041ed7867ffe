"""What every benchmark shares, written once: its flags, its clock, its child processes, its memory readings,
the machine it names and its ratio lines.

A benchmark times a thing and its baseline in the same run on the same machine and prints their ratio: on a
shared machine the seconds move with the load, the ratios much less. A script is `main(**flags)` and a line
`raise SystemExit(timing.cli(main, __doc__))`: its flags are `main`'s keyword parameters (`--repeats`, typed by
the annotation; a list takes several values, a bool is a switch, no default makes it required), never a
namespace handed on. A measurement that needs a fresh process (its own peak memory, its own allocator, one
backend patched) is a function the script names in `children`, run by `child` and answered as one JSON line.
Scripts run as `python benchmarks/X.py`, this folder first on sys.path, so `import timing` is this file; it
puts the repository's root after it, for the tests' stand-ins a benchmark shares (tests/evalm/paths.py).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import time
import typing
from collections.abc import Callable
from pathlib import Path

sys.path.insert(1, str(Path(__file__).resolve().parents[1]))


def cli(main: Callable, doc: str, children: dict[str, Callable] | None = None, argv: list[str] | None = None):
    """Run a script: `--child NAME ARGS_JSON` prints children[NAME](*args) as JSON; otherwise main(**flags)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        print(json.dumps(children[argv[1]](*json.loads(argv[2]))), flush=True)
        return 0
    parser = argparse.ArgumentParser(allow_abbrev=False, description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    hints = typing.get_type_hints(main)
    for name, param in inspect.signature(main).parameters.items():
        _flag(parser, "--" + name.replace("_", "-"), hints[name], param.default)
    return main(**vars(parser.parse_args(argv)))


def _flag(parser: argparse.ArgumentParser, flag: str, hint, default) -> None:
    required = default is inspect.Parameter.empty
    shown = "required" if required else f"default: {' '.join(map(str, default)) or 'none'}" \
        if isinstance(default, (list, tuple)) else f"default: {default}"
    if hint is bool:
        parser.add_argument(flag, action="store_true", help="a switch (default: off)")
    elif typing.get_origin(hint) in (list, tuple):
        parser.add_argument(flag, nargs="*", type=typing.get_args(hint)[0], default=None if required else list(default),
                            required=required, help=shown)
    else:
        kind = next(a for a in typing.get_args(hint) if a is not type(None)) if typing.get_args(hint) else hint
        parser.add_argument(flag, type=kind, default=None if required else default, required=required, help=shown)


def child(script: str, name: str, *args) -> dict:
    """children[name](*args) of `script` in a fresh process: its JSON answer (a failure ends the run, its
    error shown)."""
    done = subprocess.run([sys.executable, script, "--child", name, json.dumps(args)], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{os.path.basename(script)} {name}{list(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def best_of(fn: Callable[[], object], repeats: int, warmup: int = 1, clock: Callable[[], float] = time.perf_counter,
            pick: Callable = min, sync: Callable[[], None] | None = None) -> float:
    """Seconds of one fn() on `clock`, the `pick` (the least disturbed: min) of `repeats` timed calls after
    `warmup` untimed ones (allocator, thread pools, compiled kernels); `sync` (a GPU's) around each call."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync and sync()
        t0 = clock()
        fn()
        sync and sync()
        times.append(clock() - t0)
    return pick(times)


TINY = {"vocab_size": 257, "d_model": 64, "n_layer": 2, "n_head": 4, "d_ff": 256, "window_size": 16, "chunk_size": 4,
        "circular_period": 8192}
"""The byte-level two-layer shape the small timings share."""


def random_model(shape: str | dict = TINY, **changes):
    """An EvalmModel of `shape` (a TOML file's [model], or fields) with `changes`, seeded random weights,
    dropout off, in eval mode: time does not depend on the weights."""
    import torch

    from evalm import EvalmModel, ModelConfig
    from evalm.config_toolkit import build, read_toml

    fields = read_toml(shape)["model"] if isinstance(shape, str) else shape
    torch.manual_seed(0)
    model = EvalmModel(build(ModelConfig, {**fields, "dropout": 0.0, "attn_dropout": 0.0, **changes}, where=str(shape)))
    model.init_weights()
    return model.eval()


def status_mib(field: str = "VmHWM") -> float:
    """A figure of /proc/self/status in MiB: VmHWM (peak resident), VmRSS, RssAnon (anonymous resident: not
    the page cache of mapped files)."""
    with open("/proc/self/status") as f:
        return int(next(x for x in f if x.startswith(field + ":")).split()[1]) / 1024


def machine() -> str:
    """The CPU as lscpu names it and the cores this process may use: the first line of every report."""
    from evalm.config_toolkit.machine import device_name

    return f"{device_name('cpu')}, {len(os.sched_getaffinity(0))} cores free to this process"


def ratio(a: float, b: float) -> str:
    """`a / b` as a speed-up or a share, `3.52x`."""
    return f"{a / b:.2f}x"
