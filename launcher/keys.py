"""Stage keys of `evalm run`: what a stage's outputs depend on, so a change reruns it and every later one.

A key hashes the stage's commands, the content of the settings files and sample folders they name
(configs, budgets, task files with their splits, books, the pile shards), files named inside those
TOML configs, the shipped word lists (filter), and the previous stage's key (the chain). Every
run-file field a stage depends on is in its commands (the MSIT data too: `evalm train msit-data`).
Files and folders are known by `storage.identity` (their bytes' SHA-256, streamed; `evalm run` caches
it in the run folder under each file's `stat`).
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path

from evalm.config_toolkit import read_toml, shipped
from evalm.config_toolkit.files import INCLUDE
from evalm.launcher.runner import unit_key
from evalm.storage import identity as content_identity


def _strings(node) -> list[str]:
    """Every string value of a parsed TOML document."""
    if isinstance(node, dict):
        return [s for v in node.values() for s in _strings(v)]
    if isinstance(node, list):
        return [s for v in node for s in _strings(v)]
    return [node] if isinstance(node, str) else []


def stage_key(r, stage: str, commands: list, previous: str,
              identity: Callable[[Path], str | None] = content_identity) -> str:
    """What a stage's outputs depend on: its commands, the content of every settings file or
    sample folder they name (configs, budgets, task files and their splits, books, instructions),
    and the key of the stage before it, so a change reruns the stage and every later one (the runner's
    `unit_key` of the stage). `identity` is the run folder's cached one (`RunFolder.identity`)."""
    return unit_key(commands, stage_inputs(r, stage, commands, identity), [previous] if previous else [])


def stage_inputs(r, stage: str, commands: list, identity: Callable[[Path], str | None] = content_identity
                 ) -> dict[str, str | None]:
    """The identities of the settings files and sample folders a stage's commands name."""
    inputs = {}
    run_dir, samples = r.dir.resolve(), r.samples.resolve()
    for arg in (a for argv in commands for a in argv):
        path = Path(str(arg))
        parents = path.resolve().parents
        if run_dir in parents and samples not in parents:  # a stage's output (the msit rows): the chain covers it
            continue
        if path.is_file() or (path.is_dir() and r.samples in path.parents):
            inputs[str(path)] = identity(path.parent if path.is_file() and r.samples in path.parents else path)
    for config in [p for p in map(Path, inputs) if p.suffix == ".toml" and p.is_file()]:
        for value in _strings(read_toml(config)):  # files a config names (word lists, budgets, tokenizers)
            if Path(value).is_file():
                inputs[value] = identity(Path(value))
        for name in tomllib.loads(config.read_text(encoding="utf-8")).get(INCLUDE, []):  # the files it starts from
            inputs[name] = identity(shipped(name))
    if stage == "filter":
        import evalm.data_pipeline.wordlists as wordlists

        inputs["shipped word lists"] = identity(Path(wordlists.__file__).parent / "wordlists")
        if (r.samples / "manifest.json").is_file():
            inputs["samples manifest"] = identity(r.samples / "manifest.json")
    return inputs
