"""No code from a model folder, ever (issue "Hostile inputs, third round", item 1).

    python -m pytest tests/hostile/test_foreign_code.py -q

A folder whose `tokenizer_config.json` (or config.json) has an `auto_map` to its own
`tokenization_evil.py` made `transformers` ask "Do you wish to run the custom code? [y/N]": the user
answering `y` ran it, and `evalm convert` copied the code and the `auto_map` into its output. Here
each command is run as a user runs it, with `y` waiting on its standard input; the planted code
writes a file when it runs, so its absence proves it never ran. Every loader goes through
`evalm.hf_folder.pretrained` (found by reading the package's source, not by a list), and the modeling
files evalm writes itself are pinned to the evalm version that wrote them, their digests recorded.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.hostile.conftest import REPO, refused_in_process
from tests.hostile.hf_folders import PLANTED, copy, edit_json, llama, plant_code
from tests.hostile.limits import user_error
from tests.models import two_label_task

transformers = pytest.importorskip("transformers")

PACKAGE = ("evalm", "config_toolkit", "data_pipeline", "train", "icl_eval", "launcher", "storage", "text", "configs")


def answering_yes(*argv, timeout: float = 240) -> subprocess.CompletedProcess:
    """`evalm ARGV` with `y` typed at any prompt (what a user does who trusts the folder)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("EVALM_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "evalm.launcher.cli", *map(str, argv)], input="y\n" * 8,
                          capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return llama(tmp_path_factory.mktemp("foreign") / "llama")


def test_every_transformers_loader_goes_through_the_one_helper():
    """Any `X.from_pretrained(...)` call in the package outside `evalm.hf_folder.pretrained` is a loader that may
    run a folder's code (or forget local_files_only); `trust_remote_code=True` is never passed."""
    calls, trusting = [], []
    for folder in PACKAGE:
        for path in sorted((REPO / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    if node.func.attr == "from_pretrained":
                        calls.append(f"{path.relative_to(REPO)}:{node.lineno}")
                    trusting += [f"{path.relative_to(REPO)}:{node.lineno}" for kw in node.keywords
                                 if kw.arg == "trust_remote_code" and not (isinstance(kw.value, ast.Constant)
                                                                           and kw.value.value is False)]
    assert calls == ["evalm/hf_folder.py:" + str(_pretrained_line())], calls
    assert trusting == [], trusting


def _pretrained_line() -> int:
    tree = ast.parse((REPO / "evalm" / "hf_folder.py").read_text())
    helper = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "pretrained")
    return next(n.lineno for n in ast.walk(helper) if isinstance(n, ast.Call) and getattr(n.func, "attr", "") ==
                "from_pretrained")


@pytest.mark.parametrize("file", ["tokenizer_config.json", "config.json"])
def test_convert_refuses_a_folder_that_asks_for_its_own_code_and_runs_none(source, tmp_path, file):
    folder = plant_code(copy(source, tmp_path / "llama"), file)
    done = answering_yes("convert", "--hf-model", folder, "--out", tmp_path / "eva")
    line = user_error(done)  # was: the prompt, `y`, the code ran, and the output carried it
    assert f"{folder / file}: auto_map names code that ships with the folder" in line, line
    assert "never runs a model folder's own code" in line
    assert not (folder / PLANTED).exists()
    assert not (tmp_path / "eva").exists()  # refused before the output folder is made


def test_an_unknown_model_type_with_code_is_one_line_not_a_bug(source, tmp_path):
    folder = copy(source, tmp_path / "odd")
    (folder / "tokenization_evil.py").write_text("raise SystemExit('ran')\n")
    edit_json(folder / "config.json", model_type="evil-llama", auto_map={"AutoConfig": "tokenization_evil.C"})
    for argv in (["convert", "--hf-model", folder, "--out", tmp_path / "eva"],
                 ["eval", "icl", "--hf-model", folder, "--task", two_label_task(tmp_path / "task"), "--shots", "0",
                  "--seeds", "1", "--methods", "concat", "--out", tmp_path / "icl"]):
        line = refused_in_process(argv)  # was: bug: ValueError ... contains custom code
        assert f"{folder / 'config.json'}: auto_map names code" in line, line
    edit_json(folder / "config.json", auto_map=None)
    line = refused_in_process(["eval", "icl", "--hf-model", folder, "--task", tmp_path / "task" / "task.toml",
                               "--shots", "0", "--seeds", "1", "--methods", "concat", "--out", tmp_path / "icl"])
    assert "model_type 'evil-llama' is not one that transformers knows" in line, line
    assert not (folder / PLANTED).exists()


def test_nearest_embedding_and_uptraining_never_run_a_folders_code(source, tmp_path, byte_model):
    folder = plant_code(copy(source, tmp_path / "encoder"))
    task = two_label_task(tmp_path / "task")
    line = user_error(answering_yes(
        "eval", "icl", "--checkpoint", byte_model, "--task", task, "--shots", "2", "--seeds", "1", "--methods",
        "concat", "--eval.nearest=[\"remove\"]", "--eval.nearest_k=1", f"--eval.nearest_embedding=\"{folder}\"",
        "--out", tmp_path / "icl"))
    assert f"{folder / 'tokenizer_config.json'}: auto_map names code" in line, line
    from tests.train.helpers import write_shards
    from tests.train.llama_helpers import uptrain_file

    from evalm.train.convert import main as convert

    assert convert(["--hf-model", str(source), "--out", str(tmp_path / "eva"), "--set", "eva.window_size=8",
                    "--set", "eva.chunk_size=4"]) == 0
    plant_code(tmp_path / "eva")  # the converted folder, edited afterwards
    write_shards(tmp_path / "tokens")
    run = uptrain_file(tmp_path / "run.toml", tmp_path / "eva", tmp_path / "tokens")
    line = refused_in_process(["train", "uptrain", "--config", run, "--out", tmp_path / "up"])
    assert f"{tmp_path / 'eva' / 'tokenizer_config.json'}: auto_map names code" in line, line
    assert not (folder / PLANTED).exists() and not (tmp_path / "eva" / PLANTED).exists()


def test_convert_copies_no_code_and_no_auto_map_from_its_source(source, tmp_path):
    """A stray Python file in the source (no auto_map asks for it) stays there; the output holds only the
    modeling file evalm wrote, pinned to this evalm, its digest in convert.json."""
    from evalm.train.convert import main as convert

    folder = copy(source, tmp_path / "llama")
    (folder / "tokenization_evil.py").write_text("raise SystemExit('ran')\n")
    assert convert(["--hf-model", str(folder), "--out", str(tmp_path / "eva")]) == 0
    out = tmp_path / "eva"
    assert sorted(p.name for p in out.glob("*.py")) == ["modeling_eva_llama.py"]
    for path in out.glob("*.json"):
        data = json.loads(path.read_text())
        if path.name != "config.json":
            assert "auto_map" not in data, path
    shim = (out / "modeling_eva_llama.py").read_bytes()
    record = json.loads((out / "convert.json").read_text())["modeling"]
    assert record == {"file": "modeling_eva_llama.py", "evalm": version("evalm"),
                      "sha256": hashlib.sha256(shim).hexdigest()}
    assert f'WRITTEN_BY = "{version("evalm")}"'.encode() in shim


@pytest.mark.slow  # ~16 s on 2 cores
def test_export_hf_writes_a_shim_pinned_to_its_evalm_with_its_digest(tmp_path, byte_model):
    """The modeling file `export --hf` writes refuses to load under another evalm (it would run that
    version's classes on this version's weights) and its SHA-256 is in export.json."""
    from evalm.train.export import main as export

    out = tmp_path / "hf"
    assert export(["--hf", "--checkpoint", str(byte_model), "--out", str(out)]) == 0
    shim = out / "modeling_evalm.py"
    record = json.loads((out / "export.json").read_text())["modeling"]
    assert record == {"file": "modeling_evalm.py", "evalm": version("evalm"),
                      "sha256": hashlib.sha256(shim.read_bytes()).hexdigest()}
    other = copy(out, tmp_path / "older")
    (other / "modeling_evalm.py").write_text(shim.read_text().replace(f'"{version("evalm")}"', '"0.0.1"', 1))
    # a user's fresh Python, where evalm registered nothing (a registered class is preferred to the folder's file)
    load = ("import sys, transformers; m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], "
            "trust_remote_code=True); print(type(m).__name__)")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", load, str(out)], capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0 and done.stdout.strip() == "EvalmForCausalLM", done.stderr[-2000:]  # this evalm: loads
    done = subprocess.run([sys.executable, "-c", load, str(other)], capture_output=True, text=True, env=env,
                          timeout=240)
    assert done.returncode != 0
    assert f"ImportError: this folder was written by evalm 0.0.1, and evalm {version('evalm')} is installed" \
        in done.stderr, done.stderr[-2000:]
