"""The ground floor of `evalm data samples`: pinned packages, fetching with hash checks, wikitext,
and the build calling the writers it is given; never touches the network.

The full command (with icl_eval's and train's writers) is tested in tests/launcher/test_samples.py.

Run: python -m pytest tests/data_pipeline/test_samples.py -q
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from evalm.data_pipeline.samples.build import Writers, build_samples
from evalm.data_pipeline.samples.fetch import fetch_verified, pip_fetch
from evalm.data_pipeline.samples.packages import GENSIM_WHEELS, Package, SampleError, gensim_package
from evalm.data_pipeline.samples.wikitext import wiki_to_text
from tests.data_pipeline.sample_packages import make_packages, no_network


def test_the_ground_floor_imports_no_upper_floor():
    # `evalm` itself is loaded as the namespace's parent; the model's modules and upper floors are not
    code = ("import sys, evalm.data_pipeline.samples.build, evalm.data_pipeline.cli; "
            "print(sorted({'.'.join(m.split('.')[:2]) for m in sys.modules} & {'evalm.icl_eval', 'evalm.train', "
            "'evalm.launcher', 'evalm.model', 'evalm.config', 'torch'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_build_writes_tasks_and_instructions_only_through_the_writers_it_is_given(tmp_path):
    """Test-local writers (not icl_eval's or train's) receive the neutral records."""
    packages = make_packages(tmp_path / "packages")
    seen: dict[str, object] = {}

    def task(folder: Path, spec, splits) -> tuple[Path, dict[str, Path]]:
        folder.mkdir(parents=True)
        files = {s: folder / f"{s}.json" for s in splits}
        for s, rows in splits.items():
            files[s].write_text(json.dumps(rows))
        (folder / "spec.txt").write_text(spec.template)
        seen[spec.name] = {s: len(rows) for s, rows in splits.items()}
        return folder / "spec.txt", files

    def instructions(path: Path, rows: list) -> None:
        path.parent.mkdir(parents=True)
        path.write_text("\n".join("\t".join(r) for r in rows))
        seen["instructions"] = len(rows)

    out = build_samples(tmp_path / "out", tmp_path / "packages", packages=packages, fetch=no_network,
                        writers=Writers(task, instructions, "tab-separated"))
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(seen) == {"rotten_tomatoes", "bbc_news", "subj", "instructions"}
    assert seen["instructions"] == sum(manifest["instructions"].values()) > 0
    assert {name: t["splits"] for name, t in manifest["tasks"].items()} == {k: seen[k] for k in manifest["tasks"]}
    assert manifest["files"]["instructions/train.jsonl"]["format"] == "tab-separated"
    assert (out / "tasks" / "subj" / "spec.txt").read_text() == "Input: {text} Type: {label}"
    written = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()} - {"manifest.json", "COMPLETE"}
    assert set(manifest["files"]) == written


def test_wikitext_markup_is_removed_and_links_keep_their_label():
    markup = ("'''Anarchism''' is a [[political philosophy|philosophy]]{{Citation needed|date=May 2020}}<ref>x</ref>\n"
              "== History ==\n[[File:A.png|thumb|cap]] See [http://example.org the site].\n[[Category:Things]]")
    assert wiki_to_text(markup) == "Anarchism is a philosophy\nHistory\n See the site."


@pytest.mark.parametrize("minor", [11, 12, 13])
@pytest.mark.parametrize("machine", ["x86_64", "aarch64", "amd64", "arm64"])
def test_gensim_has_a_pinned_wheel_for_every_supported_interpreter(minor, machine):
    package = gensim_package(f"cp3{minor}", machine)
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    assert package.filename.startswith(f"gensim-4.4.0-cp3{minor}-cp3{minor}-") and arch in package.filename
    assert len(package.sha256) == 64
    assert len({p[1] for p in GENSIM_WHEELS.values()}) == len(GENSIM_WHEELS)  # a hash per file


def test_unsupported_interpreter_is_refused_naming_the_supported_ones(tmp_path):
    package = gensim_package("cp314", "x86_64")
    with pytest.raises(SampleError, match="supported: cp311 x86_64"):
        fetch_verified(package, tmp_path, fetch=no_network)


def test_a_failed_fetch_names_the_package_the_file_and_pips_own_error(tmp_path, monkeypatch):
    # pip with no index and an empty find-links folder fails at once, offline
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    package = Package("evalm-no-such-package", "0.0.1", "evalm_no_such_package-0.0.1-py3-none-any.whl", "0" * 64, "-")
    with pytest.raises(SampleError) as err:
        pip_fetch(package, tmp_path / "cache")
    message = str(err.value)
    assert "evalm-no-such-package==0.0.1" in message and package.filename in message
    assert "No matching distribution" in message or "Could not find" in message
