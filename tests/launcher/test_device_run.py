"""The device run's driver (launcher/device_run.py) on the CPU, with tiny sections that sleep:

    python -m pytest tests/launcher/test_device_run.py -q

Its dry run prints the plan and every timeout and writes nothing; each section's JSON is written as
it ends (the next section finds it on disk); a section past its timeout is killed with its children,
recorded as "timeout", and the next one runs; one that starts with too little of the budget left is
recorded as skipped; pytest's junit XML becomes every test's name, outcome and seconds; a file's
blob id is git's own (`git hash-object`), so a run's sources compare with `git ls-tree` offline; the
evidence is packed into one file after every section; the laid-out `evalm` wins over the root's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from evalm.launcher import device_run
from evalm.launcher.device_run import Section, run_sections

ROOT = Path(__file__).resolve().parents[2]


def python(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def test_the_dry_run_prints_the_plan_and_its_timeouts_and_writes_nothing(tmp_path):
    done = subprocess.run(["bash", str(ROOT / "scripts" / "device_run.sh"), "abc1234", "--dry-run"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env={"OUT": str(tmp_path / "out"), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "evidence in " in lines[0] and "-abc1234" in lines[0] and "budget 470 s" in lines[0]
    for name, seconds in device_run.SECTION_S.items():
        assert any(line.split()[:3] == [name, "timeout", f"{seconds}"] for line in lines), (name, lines)
    assert any("-rA" in line and "--timeout=" in line and "--junitxml=" in line for line in lines)
    assert not (tmp_path / "out").exists()


def test_each_section_lands_as_it_ends_and_a_timeout_does_not_stop_the_next(tmp_path):
    sections = [
        Section("first", python("print('one')"), 30),
        Section("sleeper", python("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
                                  "'import time; time.sleep(60)']); time.sleep(60)"), 1.5),
        Section("reader", python(f"import pathlib, sys; f = pathlib.Path({str(tmp_path)!r}); "
                                 "sys.exit(0 if (f / 'first.json').is_file() and (f / 'sleeper.json').is_file() else 3)"), 30),
        Section("failing", python("raise SystemExit(4)"), 30),
    ]
    t0 = time.perf_counter()
    records = run_sections(sections, tmp_path, time.monotonic() + 120, "abc1234")
    assert time.perf_counter() - t0 < 30  # the sleeper and its child were killed, not waited for
    assert [r["status"] for r in records] == ["ok", "timeout", "ok", "failed"]
    assert records[3]["rc"] == 4 and records[1]["rc"] is None
    for record in records:
        assert json.loads((tmp_path / f"{record['section']}.json").read_text()) == record
    assert (tmp_path / "first.log").read_text().strip() == "one"
    run = json.loads((tmp_path / "run.json").read_text())
    assert [s["status"] for s in run["sections"]] == ["ok", "timeout", "ok", "failed"] and run["commit"] == "abc1234"


def test_a_section_with_too_little_budget_left_is_skipped_and_recorded(tmp_path):
    sections = [Section("first", python("import time; time.sleep(2)"), 30), Section("late", python("print(1)"), 30)]
    records = run_sections(sections, tmp_path, time.monotonic() + device_run.MIN_SECTION_S + 1.5, "abc1234")
    assert records[0]["status"] == "ok" and records[0]["timeout_s"] <= device_run.MIN_SECTION_S + 1.5
    assert records[1]["status"] == "skipped" and records[1]["reason"].startswith("budget")
    assert not (tmp_path / "late.log").exists()


def test_the_junit_xml_gives_every_tests_name_outcome_and_seconds(tmp_path):
    (tmp_path / "test_three.py").write_text(
        "import pytest, time\n"
        "def test_passes():\n    time.sleep(0.05)\n"
        "def test_fails():\n    assert 1 == 2, 'one is not two'\n"
        "@pytest.mark.skip(reason='not here')\ndef test_skipped():\n    pass\n")
    xml = tmp_path / "tests.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_three.py"),
                    f"--junitxml={xml}"], cwd=tmp_path, capture_output=True, timeout=120)
    got = device_run.junit_tests(xml)
    by_name = {t["name"].rsplit("::", 1)[1]: t for t in got["tests"]}
    assert {k: v["outcome"] for k, v in by_name.items()} == {"test_passes": "passed", "test_fails": "failed",
                                                             "test_skipped": "skipped"}
    assert by_name["test_passes"]["seconds"] >= 0.05 and "one is not two" in by_name["test_fails"]["message"]
    assert got["counts"] == {"passed": 1, "failed": 1, "error": 0, "skipped": 1}


def test_a_files_blob_id_is_gits(tmp_path):
    path = tmp_path / "x.py"
    path.write_bytes(b"print('\xc3\xa9')\n")
    want = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True, check=True).stdout.strip()
    assert device_run.blob_id(path.read_bytes()) == want


def test_a_section_that_died_mid_write_is_recorded_not_fatal(tmp_path):
    """A benchmark section killed before its first row (no gpu.json, or half of one) and a test run
    killed before pytest wrote its junit XML: each recorded as such; the driver goes on."""
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "gpu.json").write_text('{"train": {"rows": [')
    (tmp_path / "tests.xml").write_text("<testsuites><testsuite><testcase name=")
    records = {name: {} for name in ("attention", "train", "tests")}
    for name, record in records.items():
        device_run.collect(name, tmp_path, record)
    assert records["attention"]["result"]["error"].startswith("no gpu.json")
    assert records["train"]["result"]["error"].startswith("no gpu.json")
    assert records["tests"]["tests"] == [] and records["tests"]["note"].startswith("no junit XML")


def test_the_pack_holds_every_section_before_a_cut(tmp_path):
    """With `pack_into`, the folder is packed after every section: the second section reads the pack
    the first left (a run cut short still brings back what ran), and the last pack holds every file."""
    folder, into = tmp_path / "2026-01-01-abc1234", tmp_path / "out"
    folder.mkdir()
    reader = ("import sys, tarfile; names = tarfile.open(sys.argv[1]).getnames(); "
              "sys.exit(0 if '2026-01-01-abc1234/first.json' in names else 3)")
    sections = [Section("first", python("print('one')"), 30),
                Section("second", (sys.executable, "-c", reader, str(into / f"{folder.name}.tar.gz")), 30)]
    records = run_sections(sections, folder, time.monotonic() + 120, "abc1234", pack_into=into)
    assert [r["status"] for r in records] == ["ok", "ok"]
    with tarfile.open(into / f"{folder.name}.tar.gz") as tar:
        names = set(tar.getnames())
        run = json.loads(tar.extractfile(f"{folder.name}/run.json").read())
    assert {f"{folder.name}/{f}" for f in ("first.json", "first.log", "second.json", "second.log", "run.json")} <= names
    assert [s["status"] for s in run["sections"]] == ["ok", "ok"]
    assert list(into.iterdir()) == [into / f"{folder.name}.tar.gz"]  # one file back, no partial left


def test_the_laid_out_evalm_wins_over_the_root_first_on_sys_path(tmp_path):
    """On the device nothing is installed: pytest's rootdir and benchmarks/timing.py put the root,
    whose evalm/ lacks the mapped floors (evalm.config_toolkit -> config_toolkit/), ahead of the site.
    The site's finder (sitecustomize.py) keeps `evalm` the laid-out one; without it the import fails.
    Run with -S: no site-packages' .pth, so this checkout's own editable finder is not there."""
    site = tmp_path / "site"
    device_run.lay_out(site)
    packages = [p for p in sys.path if p.endswith("site-packages")]

    def attempt(finder: bool) -> subprocess.CompletedProcess:
        code = ("import runpy, sys\n" + (f"runpy.run_path({str(site / 'sitecustomize.py')!r})\n" if finder else "") +
                f"sys.path[:0] = [{str(ROOT)!r}]\nsys.path += {packages!r}\n"
                "import evalm.config_toolkit, evalm\nprint(evalm.__path__[0])")
        return subprocess.run([sys.executable, "-S", "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)

    done = attempt(True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(site / "evalm")
    bare = attempt(False)
    assert bare.returncode != 0 and "evalm.config_toolkit" in bare.stderr
