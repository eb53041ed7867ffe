"""The package works from a non-editable install outside the checkout: the wheel carries the configs
that `evalm run` and `evalm train metaicl` start from, and `configs/NAME.toml` resolves to them."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = """
import evalm, pathlib, sys
site = pathlib.Path(sys.argv[1]).resolve()
assert pathlib.Path(evalm.__file__).resolve().is_relative_to(site), evalm.__file__
from evalm.launcher.run import DEFAULT_CONFIG
from evalm.launcher.run_file import load_run
from evalm.train.metaicl import DEFAULT_CONFIG as METAICL
r = load_run(DEFAULT_CONFIG)
for f in (DEFAULT_CONFIG, METAICL, r.pretrain.config, r.msit.config, r.data.blend[1]):
    assert pathlib.Path(f).resolve().is_relative_to(site) and pathlib.Path(f).is_file(), f
from evalm.config_toolkit import read_toml
assert read_toml("configs/evalm-350m.toml")["model"]["d_model"] == 1024
print("ok", DEFAULT_CONFIG)
"""


def test_the_wheel_ships_the_configs_and_runs_them_from_outside_the_checkout(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(REPO)], check=True, capture_output=True)
    [wheel] = (tmp_path / "dist").glob("evalm-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "evalm/configs/tiny.toml" in names and "evalm/configs/metaicl-tiny.toml" in names
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = subprocess.run([sys.executable, "-c", PROBE, str(site)], cwd=away, env=env, capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.startswith("ok ")
    helped = subprocess.run([sys.executable, "-m", "evalm.launcher.cli", "run", "--help"], cwd=away, env=env,
                            capture_output=True, text=True)
    assert helped.returncode == 0 and "configs/tiny.toml" in helped.stdout
