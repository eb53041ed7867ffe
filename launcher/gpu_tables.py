"""The GPU tables of docs/results.md ("EVA on a GPU"), made from one device run's evidence folder
(launcher/device_run.py, committed as docs/runs/DATE-COMMIT/) and from nothing else.

    python -m evalm.launcher.gpu_tables docs/runs/DATE-COMMIT [--results docs/results.md]

Replaces the block between the two gpu-tables markers of the results file. Refuses, in one line
(exit 2), a run whose figures would not stand:
- its CUDA tests did not all pass (a failed, erroring or skipped test, no test at all, a test run
  cut short by its timeout);
- a section ran at another commit than the tests, or the run's sources (env.json's blob ids of
  every .py and .toml file it ran) differ from that commit's files in this repository, or the
  commit is not in it: figures count only for the code whose tests passed.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

from evalm.config_toolkit.errors import InputError, MissingInput, report
from evalm.config_toolkit.markdown import markdown
from evalm.storage.files import read_json, read_text, write_atomic

BEGIN = "<!-- gpu-tables: begin (python -m evalm.launcher.gpu_tables RUN; not edited by hand) -->"
END = "<!-- gpu-tables: end -->"
SECTIONS = ("attention", "train", "cache")
SOURCE_SUFFIXES = (".py", ".toml")


def load(folder: Path) -> dict:
    """env.json, tests.json and each benchmark section's JSON (None where it never ran)."""
    for name in ("env.json", "tests.json"):
        if not (folder / name).is_file():
            raise MissingInput(f"{folder}: no {name}; give the folder a device run wrote (launcher/device_run.py)")
    run = {name: read_json(folder / f"{name}.json") for name in ("env", "tests")}
    run.update({name: read_json(folder / f"{name}.json") if (folder / f"{name}.json").is_file() else None
                for name in SECTIONS})
    return run


def check_tests(folder: Path, tests: dict) -> None:
    counts = tests.get("counts") or {}
    bad = [t["name"] for t in tests.get("tests", []) if t.get("outcome") != "passed"]  # on a GPU none skips
    if tests.get("status") != "ok" or bad or not counts.get("passed"):
        named = f": {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}" if bad else ""
        raise InputError(f"{folder}: its CUDA tests did not all pass (status {tests.get('status')}, "
                         f"{counts.get('passed', 0)} passed, {counts.get('failed', 0)} failed, "
                         f"{counts.get('error', 0)} errors, {counts.get('skipped', 0)} skipped{named}); figures come only from a "
                         "run whose tests passed")


def committed_sources(repo: Path, commit: str) -> dict[str, str]:
    """{path: blob id} of the commit's .py and .toml files, outside hidden folders (device_run's `sources`)."""
    try:
        done = subprocess.run(["git", "ls-tree", "-r", "--full-tree", commit], cwd=repo, capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise InputError(f"{repo}: git could not list commit {commit} ({err}); run this in the repository") from None
    if done.returncode != 0:
        raise InputError(f"commit {commit!r} of the run is not in {repo}; fetch it, or give a run made at a commit here")
    found = {}
    for line in done.stdout.splitlines():
        meta, path = line.split("\t", 1)
        parts = path.split("/")
        if path.endswith(SOURCE_SUFFIXES) and parts[0] != "shared" and not any(
                p.startswith(".") or p == "__pycache__" for p in parts):
            found[path] = meta.split()[2]
    return found


def check_commit(folder: Path, run: dict, repo: Path) -> str:
    """The one commit of the run: the tests', every section's and the sources' (else a refusal)."""
    commit = run["tests"].get("commit") or ""
    others = {name: (run[name] or {}).get("commit") for name in ("env", *SECTIONS) if run[name] is not None}
    differ = {name: c for name, c in others.items() if c != commit}
    if not commit or differ:
        raise InputError(f"{folder}: the tests ran at commit {commit or 'unknown'!r} but {', '.join(differ)} at "
                         f"{', '.join(map(repr, sorted(set(differ.values()), key=str)))}; figures stand only for "
                         "the commit whose tests passed: rerun the device run")
    ran, committed = run["env"].get("sources") or {}, committed_sources(repo, commit)
    changed = sorted(p for p in ran.keys() | committed.keys() if ran.get(p) != committed.get(p))
    if changed:
        raise InputError(f"{folder}: {len(changed)} source files that ran differ from commit {commit[:12]} "
                         f"({', '.join(changed[:3])}{' ...' if len(changed) > 3 else ''}); the run's tree was not "
                         "that commit: commit first, then run")
    return commit


def _table(header: list[str], rows: list[dict], cells) -> list[str]:
    """The rows as markdown; a skipped row is its length and why."""
    if not rows:
        return []
    return markdown(header, [[str(row.get("n", row.get("shots", "?"))), f"skipped: {row['skipped']}"] if "skipped" in row
                             else cells(row) for row in rows]).splitlines()


def _section(name: str, record: dict | None) -> tuple[list[dict], list[str]]:
    """(rows, a status line where the section did not finish cleanly)."""
    if record is None:
        return [], [f"{name}: not run."]
    result = record.get("result") or {}
    note = [] if record.get("status") == "ok" and "error" not in result else [
        f"{name}: {record.get('status')} after {record.get('seconds', 0):.0f} s of {record.get('timeout_s')} s"
        + (f" ({result['error'][:200]})" if "error" in result else "") + f"; its output in {name}.log.", ""]
    return result.get("rows", []), note


def _mfu(row: dict, key: str) -> str:
    value = row.get(key)
    if value is None and key == "mfu_torchtitan" and "flops_per_token" in row:  # rows from before the count
        flops = row["flops_per_token"]
        value = row["mfu_datasheet"] * flops["torchtitan"] / flops["total"] if "torchtitan" in flops else None
    return "n/a" if value is None else f"{100 * value:.1f}%"


def attention_lines(record: dict | None) -> list[str]:
    rows, note = _section("attention", record)
    return note + _table(
        ["tokens", "batch", "attn dropout", "EVA ms", "Flash-2 SDPA ms", "cuDNN SDPA ms", "speed-up: Flash-2 / fastest",
         "FLOP limit", "TFLOP/s EVA / Flash-2", "GiB EVA / Flash-2"], rows,
        lambda x: [f"{x['n']:,}", str(x["batch"]), str(x["dropout"]), f"{x['eva_ms']:.2f}", f"{x['sdpa_ms']:.2f}",
                   "n/a" if x.get("cudnn_ms") is None else f"{x['cudnn_ms']:.2f}",
                   f"{x['speedup']:.2f}× / **{x.get('speedup_fastest', x['speedup']):.2f}×**", f"{x['flop_limit']:.1f}×",
                   f"{x['eva_tflops']:.0f} / {x['sdpa_tflops']:.0f}", f"{x['eva_peak_gib']:.2f} / {x['sdpa_peak_gib']:.2f}"])


def train_lines(record: dict | None) -> list[str]:
    rows, note = _section("train", record)
    return note + _table(
        ["tokens a line", "attention", "tokens/s", "step s", "MFU causal / torchtitan", "GFLOPs/token 6N + attention (K)",
         "peak GiB", "loss first → last", "graphs / breaks"], rows,
        lambda x: [f"{x['n']:,}", x["attention"] + " compiled" * bool(x.get("compiled")), f"{x['tokens_per_s']:,.0f}",
                   f"{x['step_s']:.3f}", f"{_mfu(x, 'mfu_datasheet')} / {_mfu(x, 'mfu_torchtitan')}",
                   f"{x['flops_per_token']['params'] / 1e9:.2f} + {x['flops_per_token']['attention'] / 1e9:.2f} "
                   f"(K = {x['flops_per_token']['keys_per_query']:,.1f})", f"{x['peak_gib']:.1f}",
                   f"{x['loss_first']:.2f} → {x['loss_last']:.2f}",
                   f"{x['graphs']} / {sum(x['breaks'].values())}" if "graphs" in x else "n/a"])


def cache_lines(record: dict | None) -> list[str]:
    rows, note = _section("cache", record)
    return note + _table(
        ["attention", "shots", "tokens", "encode s", "ms per test item", "cache MiB", "K/V cache MiB"], rows,
        lambda x: [x["attention"], f"{x['shots']:,}", f"{x['tokens']:,}", f"{x['encode_s']:.2f}", f"{x['item_ms']:.2f}",
                   f"{x['cache_mib']:.1f}", f"{x['kv_cache_mib']:.1f}"])


def tables(folder: Path, run: dict, commit: str) -> str:
    """The block: where and on what it ran, every CUDA test with its time, then the three tables."""
    env, tests = run["env"], run["tests"]
    peaks = next((r.get("gpu", {}).get("peaks_tflops") for r in (run[n] for n in SECTIONS) if r and r.get("gpu")), None)
    peak = f"; bf16 products {peaks['measured']:.0f} TFLOP/s measured, {peaks['datasheet']:.0f} datasheet" if peaks else ""
    out = [f"Run `{folder.name}` (docs/runs/{folder.name}/): commit {commit[:12]}, {env.get('device', '?')} "
           f"({env.get('nvidia_smi', '?')}), torch {env.get('torch', '?')}, CUDA {env.get('cuda', '?')}, Triton "
           f"{env.get('triton', '?')}, Python {env.get('python', '?')}, started {env.get('started_utc', '?')}{peak}.", "",
           f"CUDA tests (tests.log): {tests['counts'].get('passed', 0)} passed, {tests['counts'].get('skipped', 0)} "
           f"skipped in {tests.get('seconds', 0):.0f} s.", ""]
    out += _table(["CUDA test", "outcome", "s"], sorted(tests["tests"], key=lambda t: t["name"]),
                  lambda t: [f"`{t['name'].rsplit('::', 1)[-1]}`", t["outcome"], f"{t['seconds']:.1f}"]) + [""]
    out += attention_lines(run["attention"]) + [""] + train_lines(run["train"]) + [""] + cache_lines(run["cache"])
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip()


def replace_block(results: Path, block: str) -> str:
    text = read_text(results, "results page")
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise InputError(f"{results}: needs one line {BEGIN!r} and, below it, one {END!r}; put them where the tables go")
    head, rest = text.split(BEGIN)
    return head + BEGIN + "\n" + block + "\n" + END + rest.split(END, 1)[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evalm.launcher.gpu_tables", allow_abbrev=False,
                                     description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("run", type=Path, help="a device run's evidence folder (docs/runs/DATE-COMMIT)")
    parser.add_argument("--results", type=Path, default=Path("docs/results.md"), help="the page whose block is replaced")
    args = parser.parse_args(argv)
    try:
        run = load(args.run)
        check_tests(args.run, run["tests"])
        commit = check_commit(args.run, run, args.results.resolve().parent)
        write_atomic(args.results, replace_block(args.results, tables(args.run, run, commit)))
    except Exception as err:  # noqa: BLE001 (the one rule: a user error in one line, a bug with its log)
        return report("gpu_tables", err)
    print(f"{args.results}: the GPU tables from {args.run} (commit {commit[:12]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
