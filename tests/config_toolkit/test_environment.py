"""No import changes the process: environment defaults are set by the command line, with one policy
(the user's explicit setting wins), and built-in defaults come from the package, not from the
working directory.

Each check runs in a fresh interpreter (`subprocess`), since an import's side effect happens once
per process and this one has imported everything already.

Run: python -m pytest tests/config_toolkit/test_environment.py -q
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HF = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def _python(code: str, cwd: Path | None = None, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k not in HF}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd,
                         env={**base, **env}, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_importing_every_package_leaves_the_environment_alone():
    code = ("import os, json; import evalm.text.data_source, evalm.launcher.commands, evalm.launcher.cli, "
            "evalm.icl_eval.settings; print(json.dumps({k: os.environ.get(k) for k in %r}))" % (HF,))
    assert json.loads(_python(code)) == {k: None for k in HF}


def test_the_command_line_sets_offline_unless_the_user_set_it():
    code = ("import os, json; from evalm.config_toolkit.environment import command_environment, hub_offline; "
            "command_environment(); print(json.dumps([os.environ.get('HF_HUB_OFFLINE'), "
            "os.environ.get('HF_DATASETS_OFFLINE'), hub_offline()]))")
    assert json.loads(_python(code)) == ["1", "1", True]
    assert json.loads(_python(code, HF_HUB_OFFLINE="0")) == ["0", "1", False]


def test_datasets_follows_the_same_policy():
    code = ("import json; from evalm.text.data_source import datasets_module; import huggingface_hub.constants as c; "
            "ds = datasets_module(); print(json.dumps([ds.config.HF_HUB_OFFLINE, c.HF_HUB_OFFLINE]))")
    assert json.loads(_python(code)) == [True, True]  # nothing set: offline
    assert json.loads(_python(code, HF_HUB_OFFLINE="0")) == [False, False]  # the user's choice wins


def test_a_model_tiny_file_in_the_working_directory_does_not_change_the_built_in_model(tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "model-tiny.toml").write_text("[model]\nd_model = 8\nn_layer = 9\n")
    code = "import json; from evalm.icl_eval.settings import tiny_model; print(json.dumps(tiny_model()))"
    here, there = json.loads(_python(code)), json.loads(_python(code, cwd=tmp_path))
    assert here == there and there["n_layer"] != 9
