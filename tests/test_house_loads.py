"""One gate per model load: a model folder is checked once per load and the check's result passed on to every
loader (the config, the model, the tokenizer), the conversion's sink rule is checked once, and checking a
folder does not import EVA. Counted through the real checkers wrapped where they are bound (a test double of
the checker, not of the loader), on the commands a user runs.

    python -m pytest tests/test_house_loads.py -q
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent
ICL = ["--shots", "0", "--seeds", "1", "--methods", "concat"]


def counted(monkeypatch, module, name: str, calls: Counter, key=lambda *a, **k: True) -> None:
    """The real `module.name`, counting the calls for which `key(*args)` holds, wherever it is bound (a module
    that imported it by name holds the same function)."""
    real = getattr(module, name)

    def wrapper(*args, **kwargs):
        if key(*args, **kwargs):
            calls[name] += 1
        return real(*args, **kwargs)

    for loaded in list(sys.modules.values()):
        if getattr(loaded, name, None) is real:
            monkeypatch.setattr(loaded, name, wrapper)


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    from tests.train.llama_helpers import tiny_llama_folder

    return tiny_llama_folder(tmp_path_factory.mktemp("loads") / "llama", dtype="float32")


def icl(folder: Path, tmp_path: Path) -> int:
    from evalm.icl_eval.cli import main
    from tests.models import two_label_task

    return main(["icl", "--hf-model", str(folder), "--task", str(two_label_task(tmp_path / "task")), *ICL,
                 "--out", str(tmp_path / "icl")])


def test_one_folder_check_per_load(llama, tmp_path, monkeypatch):
    """`evalm eval icl --hf-model` (its source's kind, the config, the model, the tokenizer) and `evalm convert`
    (the source's config, its model, its tokenizer) each check the folder once."""
    import evalm.icl_eval.models.hf  # noqa: F401 - every loader loaded, so that its binding is wrapped too
    import evalm.icl_eval.models.source  # noqa: F401
    import evalm.train.convert
    from evalm import hf_folder

    calls: Counter = Counter()
    counted(monkeypatch, hf_folder, "check_folder", calls)
    assert icl(llama, tmp_path) == 0
    assert calls["check_folder"] == 1, calls
    calls.clear()
    assert evalm.train.convert.main(["--hf-model", str(llama), "--out", str(tmp_path / "eva"),
                                     "--set", "eva.window_size=8", "--set", "eva.chunk_size=4"]) == 0
    assert calls["check_folder"] == 1, calls
    calls.clear()
    assert icl(tmp_path / "eva", tmp_path / "again") == 0  # the converted (EVA) folder, loaded with evalm's classes
    assert calls["check_folder"] == 1, calls


def test_the_sink_rule_is_checked_once_per_conversion(llama, tmp_path, monkeypatch):
    """The conversion's settings meet the sink rule once (when they are read), not again in every config and model
    the conversion builds from them."""
    import evalm.llama_adapter  # noqa: F401 - loaded, so that its binding is wrapped too
    import evalm.train.convert
    from evalm import eva_settings

    calls: Counter = Counter()
    counted(monkeypatch, eva_settings, "check_sink_rule", calls,
            key=lambda eva, placement: eva.sink_tokens == 4 and placement.sink_positions == "window")
    assert evalm.train.convert.main(["--hf-model", str(llama), "--out", str(tmp_path / "eva"), "--set",
                                     "eva.window_size=8", "--set", "eva.chunk_size=4", "--set", "eva.sink_tokens=4",
                                     "--set", "eva.sink_positions=\"window\""]) == 0
    assert calls["check_sink_rule"] == 1, calls


def test_checking_a_plain_folder_imports_transformers_not_eva(llama):
    """The gate reaches `transformers` through config_toolkit's optional import, not through EVA's attention."""
    code = ("import sys\nfrom evalm import hf_folder\nhf_folder.check_folder(sys.argv[1])\n"
            "print(sorted(m for m in ('evalm.eva', 'evalm.hf_attention', 'evalm.model') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, str(llama)], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]", done.stdout
