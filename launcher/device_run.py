"""One device run on a bare GPU machine: offline set-up, the CUDA tests, then attention, training and
the cache (benchmarks/gpu.py), each a child process under its own timeout, its JSON written the
moment it ends, so a run cut short still leaves every section before the cut.

    python3 launcher/device_run.py --out OUT [--commit C] [--budget 470] [--dry-run]   # scripts/device_run.sh

Standard library only and run as a file: on the device nothing is installed yet. The set-up
installs the wheels of `.wheels/` (scripts/device_wheels.sh fills it; pure-Python ones and, for
the few compiled ones, one per CPython) into a site folder with pip, offline, and lays the project
out there for import as pyproject.toml maps it (`evalm` plus its floors, as links: no build, no
setuptools). Every child runs with that folder first on PYTHONPATH.

The evidence, OUT/<date>-<commit>/ (with --pack also PACK/<date>-<commit>.tar.gz, rewritten after set-up and
every section: scripts/device_run.sh packs into the run tool's $OUT), committed as docs/runs/<date>-<commit>/
and read by `python -m evalm.launcher.gpu_tables` (docs/results.md, "EVA on a GPU"):
    env.json        device, driver, torch, CUDA, Triton, Python, host, the commit, and `sources`: the
                    git blob id of every .py and .toml file the run imported from (a commit is only a
                    claim; the blob ids prove the tree that ran was the commit's)
    setup.json      the offline install's outcome; setup.log its output
    tests.json      every CUDA test's name, outcome and seconds (pytest's junit XML, tests.xml), the
                    counts, rc, status; tests.log pytest's -rA output
    <section>.json  attention, train, cache: status (ok / failed / timeout / skipped), rc, seconds,
                    timeout_s, the commit, and `result`: that section of benchmarks/gpu.py's report
    run.json        the plan and each section's status so far, rewritten after every section
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / ".wheels"
SITE = Path("/tmp/evalm-device-site")
REQUIREMENTS = ROOT / "scripts" / "device_wheels.txt"
TEST_FILES = ("tests/evalm/test_flex_cuda.py", "tests/evalm/test_eva_selection.py")
PER_TEST_S = 120  # one test: its kernels compile (tens of seconds on an H200) and run
BUDGET_S = 470  # the whole run under the 8 minutes the device script is given, set-up included
SECTION_S = {"tests": 180, "attention": 90, "train": 140, "cache": 50}
"""Each section's timeout, in the order they run: the tests first (figures count only where they
pass), then the attention rows, the training rows, the cache rows. A section gets at most what is
left of the budget, and is skipped with less than MIN_SECTION_S."""
MIN_SECTION_S = 20
TRAIN_STEPS = 10  # timed steps a training row (after 2 warm-up): six rows, the compiled ones among them, in the section
ENV_S, SETUP_S, KILL_GRACE_S = 60, 120, 5


@dataclass(frozen=True)
class Section:
    """One child process: its argv, its timeout, and where its result lands."""

    name: str
    argv: tuple[str, ...]
    timeout_s: float
    env: dict[str, str] = field(default_factory=dict)  # set for the child on top of os.environ


def blob_id(data: bytes) -> str:
    """git's object id of a file's bytes (`git hash-object`): comparable with `git ls-tree` offline."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def source_files(root: Path) -> list[Path]:
    """The .py and .toml files of the tree a run imports from, outside hidden and cache folders (and
    shared/, which the run tool may carry beside the repository's own files)."""
    found = []
    for path in sorted(root.rglob("*")):
        parts = path.relative_to(root).parts
        if path.suffix in (".py", ".toml") and path.is_file() and parts[0] != "shared" and not any(
                p.startswith(".") or p == "__pycache__" or p.endswith(".egg-info") for p in parts):
            found.append(path)
    return found


def sources(root: Path) -> dict[str, str]:
    """{relative path: blob id} of `source_files`."""
    return {str(p.relative_to(root)): blob_id(p.read_bytes()) for p in source_files(root)}


def write_json(path: Path, value) -> None:
    """Whole or not at all (a run killed mid-write leaves the previous file, never half of one)."""
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text(json.dumps(value, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def run_child(argv, timeout_s: float, log: Path, env: dict | None = None, cwd: Path = ROOT) -> tuple[str, int | None, float]:
    """(status, rc, seconds) of argv run to `log` in its own process group; past timeout_s the whole
    group is killed (pytest's workers, the compiler's), status "timeout"."""
    t0 = time.perf_counter()
    with open(log, "ab") as out:
        child = subprocess.Popen(list(argv), cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env={**os.environ, **(env or {})}, start_new_session=True)
        try:
            rc = child.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(child)
            return "timeout", None, time.perf_counter() - t0
    return ("ok" if rc == 0 else "failed"), rc, time.perf_counter() - t0


def _kill_group(child: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(child.pid, sig)
        except ProcessLookupError:
            return
        try:
            child.wait(timeout=KILL_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def pack(folder: Path, into: Path) -> Path:
    """folder as one gzipped tar, into/<folder's name>.tar.gz, written whole or not at all: the run
    tool brings back at most 8 files, and the evidence is a dozen."""
    into.mkdir(parents=True, exist_ok=True)
    target = into / f"{folder.name}.tar.gz"
    tmp = target.with_name(f".{target.name}.partial")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    os.replace(tmp, target)
    return target


def run_sections(sections: list[Section], folder: Path, deadline: float, commit: str,
                 collect=None, pack_into: Path | None = None) -> list[dict]:
    """Run each section in order, writing folder/<name>.json and folder/run.json as each ends. A
    section gets min(its timeout, what is left before `deadline`); under MIN_SECTION_S it is skipped.
    `collect(name, record)` adds what the section produced (its result) to the record. With
    `pack_into`, the folder is packed there (`pack`) after every section, so a cut keeps the rest."""
    records = []
    for s in sections:
        left = deadline - time.monotonic()
        record = {"section": s.name, "commit": commit, "timeout_s": round(min(s.timeout_s, left), 1),
                  "command": list(s.argv)}
        if left < MIN_SECTION_S:
            record.update(status="skipped", reason=f"budget: {max(left, 0):.0f} s left", rc=None, seconds=0.0)
        else:
            status, rc, seconds = run_child(s.argv, min(s.timeout_s, left), folder / f"{s.name}.log", s.env)
            tail = (folder / f"{s.name}.log").read_bytes()[-4000:].decode("utf-8", "replace").splitlines()[-15:]
            record.update(status=status, rc=rc, seconds=round(seconds, 2), tail=tail)
            if collect is not None:
                collect(s.name, folder, record)
        write_json(folder / f"{s.name}.json", record)
        records.append(record)
        write_json(folder / "run.json", {"commit": commit, "sections": [
            {k: r.get(k) for k in ("section", "status", "rc", "seconds", "timeout_s")} for r in records],
            "planned": [s.name for s in sections]})
        if pack_into is not None:
            pack(folder, pack_into)
    return records


# ------------------------------------------------------------------ the device's sections

def pytest_argv(folder: Path) -> tuple[str, ...]:
    """The CUDA tests: every test's name and outcome shown (-rA) and in junit XML with its time, a
    timeout per test; plugins named, not auto-loaded (the image may hold others built for another
    pytest); in parallel processes where xdist is there (each compiles its own kernels)."""
    argv = [sys.executable, "-m", "pytest", "-rA", "-v", "-m", "cuda", *TEST_FILES, "-p", "no:cacheprovider",
            "-p", "pytest_timeout", f"--timeout={PER_TEST_S}", f"--junitxml={folder / 'tests.xml'}"]
    if importlib.util.find_spec("xdist") or (SITE / "xdist").is_dir():
        argv += ["-p", "xdist.plugin", "-n", "6"]
    return tuple(argv)


def gpu_argv(name: str, folder: Path, commit: str, timeout_s: float) -> tuple[str, ...]:
    """benchmarks/gpu.py for one section, its own budget inside the timeout (rows past it skipped)."""
    argv = [sys.executable, "benchmarks/gpu.py", "--out", str(folder / name), "--sections", name,
            "--budget", str(max(10, timeout_s - 15)), "--commit", commit]  # 15 s: torch's import, the matmul peak
    return tuple(argv + (["--compile", "--train-steps", str(TRAIN_STEPS)] if name == "train" else []))


def plan(folder: Path, commit: str) -> list[Section]:
    env = {"PYTHONPATH": f"{SITE}{os.pathsep}{ROOT}", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONUNBUFFERED": "1"}
    out = [Section("tests", pytest_argv(folder), SECTION_S["tests"], env)]
    return out + [Section(n, gpu_argv(n, folder, commit, SECTION_S[n]), SECTION_S[n], env)
                  for n in ("attention", "train", "cache")]


def junit_tests(xml: Path) -> dict:
    """Every test case of pytest's junit XML: name, outcome, seconds, message; and the counts."""
    tests = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome, message = {"failure": "failed"}.get(tag, tag), (found.get("message") or "")[:500]
                break
        tests.append({"name": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                      "seconds": float(case.get("time") or 0), "message": message})
    counts = {k: sum(t["outcome"] == k for t in tests) for k in ("passed", "failed", "error", "skipped")}
    return {"tests": tests, "counts": counts}


def collect(name: str, folder: Path, record: dict) -> None:
    """A section's result beside its status: the tests from the junit XML, the benchmark sections
    from their part of gpu.json (written by benchmarks/gpu.py after each of its sections)."""
    if name == "tests":
        try:
            record.update(junit_tests(folder / "tests.xml"))
        except (OSError, ET.ParseError) as err:  # pytest killed before it wrote the XML: tests.log has the names
            record.update(tests=[], counts={}, note=f"no junit XML: {type(err).__name__}")
        return
    report = folder / name / "gpu.json"
    try:
        whole = json.loads(report.read_text())
    except (OSError, ValueError) as err:  # the section died before its first row
        record["result"] = {"error": f"no gpu.json: {type(err).__name__}"}
    else:
        record["result"] = whole.get(name)
        record["gpu"] = {k: whole.get(k) for k in ("device", "torch", "cuda", "peaks_tflops")}


# ------------------------------------------------------------------ set-up and the environment

ENV_CODE = """
import json, platform, sys
info = {"python": sys.version.split()[0], "platform": platform.platform(), "machine": platform.machine()}
try:
    import torch
    info.update(torch=torch.__version__, cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(),
                cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(device=torch.cuda.get_device_name(0), device_gib=round(p.total_memory / 2**30, 1),
                    capability=f"{p.major}.{p.minor}", device_count=torch.cuda.device_count())
except Exception as err:
    info["torch_error"] = f"{type(err).__name__}: {err}"
for name in ("triton", "numpy", "pytest", "pydantic"):
    try:
        info[name] = __import__(name).__version__
    except Exception as err:
        info[name] = f"missing ({type(err).__name__})"
print(json.dumps(info))
"""


def child_json(argv, timeout_s: float, env: dict | None = None) -> dict:
    """The JSON a child prints on its last line, or what went wrong (never raises)."""
    try:
        done = subprocess.run(list(argv), cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, **(env or {})})
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, OSError, ValueError, IndexError) as err:
        return {"error": f"{type(err).__name__}: {err}"[:300]}


def environment(commit: str, env: dict) -> dict:
    """The machine and the software the run's figures hold for (env.json)."""
    info = child_json([sys.executable, "-c", ENV_CODE], ENV_S, env)
    smi = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    try:
        info["nvidia_smi"] = subprocess.run(smi, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as err:
        info["nvidia_smi"] = f"unavailable: {type(err).__name__}"
    return {"commit": commit, "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "cpus": os.cpu_count(), **info, "sources": sources(ROOT)}


def git_commit() -> str:
    """HEAD's id where the tree is a git checkout, else "" (the device copy may carry no .git)."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


# A child may put the repository's root ahead of PYTHONPATH (pytest's rootdir, benchmarks/timing.py),
# and the root's evalm/ lacks the floors pyproject.toml maps in (evalm.config_toolkit -> config_toolkit/).
# A finder ahead of sys.path keeps `evalm` the site's, as an editable install's finder does.
FINDER = '''"""Written by launcher/device_run.py (see FINDER there): `evalm` is imported from this folder."""
import importlib.machinery
import sys


class SiteEvalm:
    @staticmethod
    def find_spec(name, path=None, target=None):
        return importlib.machinery.PathFinder.find_spec(name, [%r]) if name == "evalm" else None


sys.meta_path.insert(0, SiteEvalm)
'''


def lay_out(site: Path) -> None:
    """The project importable from `site` as pyproject.toml maps it, without a build: site/evalm holds a
    link to each entry of evalm/ and one per floor (evalm/train -> train/, ...); site/sitecustomize.py
    (FINDER) makes `evalm` resolve there wherever the root stands on sys.path."""
    dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    package = site / "evalm"
    package.mkdir(parents=True, exist_ok=True)
    links = {package / p.name: p for p in (ROOT / dirs["evalm"]).iterdir() if p.name != "__pycache__"}
    links.update({site.joinpath(*name.split(".")): ROOT / folder for name, folder in dirs.items() if name != "evalm"})
    for link, target in links.items():
        if not link.is_symlink():
            link.symlink_to(target)
    (site / "sitecustomize.py").write_text(FINDER % str(site))


def setup(folder: Path) -> dict:
    """Install the carried wheels pip finds for this Python into SITE (offline; --no-deps: the list
    is complete) and lay the project out there. A wheel for another Python is left alone by pip."""
    SITE.mkdir(parents=True, exist_ok=True)
    names = [n for n in (line.split("#")[0].strip() for line in REQUIREMENTS.read_text().splitlines()) if n]
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--find-links", str(WHEELS),
           "--target", str(SITE), "--upgrade"]
    deadline = time.monotonic() + SETUP_S
    status, rc, seconds = run_child(pip + names, SETUP_S, folder / "setup.log")
    missing = []
    if status == "failed":  # one wheel pip cannot take here (another Python): install the others one by one
        for name in names:
            if run_child(pip + [name], max(1.0, deadline - time.monotonic()), folder / "setup.log")[0] != "ok":
                missing.append(name)
    lay_out(SITE)
    return {"status": status, "rc": rc, "seconds": round(seconds, 2), "missing": missing, "site": str(SITE),
            "wheels": sorted(p.name for p in WHEELS.glob("*.whl"))}


# ------------------------------------------------------------------ the command

def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="launcher/device_run.py", allow_abbrev=False,
                                     description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="the folder the run's evidence folder is made in")
    parser.add_argument("--commit", default="", help="the commit the tree is (default: git's HEAD, where there is a .git)")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help=f"seconds for everything (default {BUDGET_S})")
    parser.add_argument("--sections", nargs="+", choices=list(SECTION_S), default=list(SECTION_S),
                        help="which sections, in this order (default: all)")
    parser.add_argument("--pack", type=Path, default=None,
                        help="also write the evidence folder as PACK/<date>-<commit>.tar.gz after set-up and every section "
                             "(default: no pack; scripts/device_run.sh packs into $OUT, the run tool brings back 8 files)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and its timeouts; run nothing")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    deadline = time.monotonic() + args.budget
    commit = args.commit or git_commit() or "unknown"
    folder = args.out / f"{datetime.datetime.now(datetime.timezone.utc).date().isoformat()}-{commit[:7]}"  # the UTC date
    sections = [s for s in plan(folder, commit) if s.name in args.sections]
    if args.dry_run:
        print(f"device run at {commit}: evidence in {folder}; budget {args.budget:.0f} s (set-up {SETUP_S} s, "
              f"environment {ENV_S} s at most)")
        for s in sections:
            print(f"  {s.name:<10} timeout {s.timeout_s:>4.0f} s  {' '.join(s.argv)}")
        print(f"  sections' timeouts add up to {sum(s.timeout_s for s in sections):.0f} s; each gets at most what is left")
        return 0
    folder.mkdir(parents=True, exist_ok=False)
    write_json(folder / "setup.json", setup(folder))
    write_json(folder / "env.json", environment(commit, sections[0].env if sections else {}))
    if args.pack is not None:
        pack(folder, args.pack)
    records = run_sections(sections, folder, deadline, commit, collect, args.pack)
    print(f"device run at {commit}: " + ", ".join(f"{r['section']} {r['status']}" for r in records) + f"; evidence in {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
