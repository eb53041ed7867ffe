"""The command line typed at its edge: no library function sees argparse's namespace,
a model source's kind is chosen in one place and loaded through one dict, the loading options are one
declaration offered as flags from one place.

Run: python -m pytest tests/icl_eval/test_cli_edge.py -q
"""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from evalm.config_toolkit import UserError
from evalm.icl_eval.models.source import KINDS, LoadOptions, ModelSource
from tests import models

ROOT = Path(__file__).resolve().parents[2]
EDGE = {"cli.py", "cli_args.py"}
"""The modules that parse the flags: the only ones whose functions may take the parsed namespace."""
LOAD_FLAGS = ("--device", "--dtype", "--context-window", "--eva-ablation", "--eva-select")


def _library_modules():
    for path in sorted((ROOT / "icl_eval").rglob("*.py")):
        if not (path.parent.name == "icl_eval" and path.name in EDGE):
            yield path, ast.parse(path.read_text(encoding="utf-8"))


def test_no_function_past_the_edge_takes_the_parsed_flags():
    """A parameter named `args` or annotated Namespace is the parsed flags travelling into the library
    (`load_lm(args, ...)`, `model_key(args, ...)` before this rule): each command converts them once."""
    found = []
    for path, tree in _library_modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                a = node.args
                for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                    hint = ast.unparse(arg.annotation) if arg.annotation is not None else ""
                    if arg.arg == "args" or "Namespace" in hint:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {getattr(node, 'name', 'lambda')}")
    assert found == [], "take typed values (protocol.skeleton.Invocation, models.source.ModelSource) instead"


def test_each_load_flag_is_declared_in_one_place():
    """No parser spells --device, --dtype, --context-window or --eva-ablation itself: `cli_args.load_flags` adds
    them from `LoadOptions` (the harness once declared --device and --dtype apart, with their own help)."""
    spelled = []
    for path in sorted((ROOT / "icl_eval").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and first.value in LOAD_FLAGS:
                    spelled.append(f"{path.relative_to(ROOT)}:{node.lineno} {first.value}")
    assert spelled == []


def _flags(parser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


def test_every_command_offers_the_load_options_its_section_holds(capsys):
    from evalm.icl_eval.cli import harness
    from evalm.icl_eval.cli_args import icl_parser, ppl_parser, recall_parser

    assert set(LOAD_FLAGS) <= _flags(icl_parser()) and set(LOAD_FLAGS) <= _flags(recall_parser())
    assert set(LOAD_FLAGS) & _flags(ppl_parser()) == {"--device", "--dtype", "--eva-ablation", "--eva-select"}  # no window in [ppl]
    with pytest.raises(SystemExit):
        harness(["--help"])
    text = capsys.readouterr().out
    assert "--device DEVICE" in text and "--dtype {float32,float64,bfloat16,float16}" in text


@pytest.mark.parametrize("cls_path", ["evalm.icl_eval.config:EvalConfig", "evalm.icl_eval.config:PerplexityConfig",
                                      "evalm.icl_eval.recall.config:RecallConfig"])
def test_a_section_s_load_keys_are_declared_once(cls_path):
    """`[eval]`, `[ppl]` and `[recall]` keep their file keys (device, dtype, ...) by inheriting them from
    `icl_eval.config.RunOptions` (and the window from `WindowedRunOptions`): no class body of the three declares
    one again, so the keys cannot drift apart; `LoadOptions.of(section)` reads them unchanged."""
    import importlib
    import inspect

    from evalm.icl_eval.config import RunOptions, WindowedRunOptions

    module, name = cls_path.split(":")
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, WindowedRunOptions if name != "PerplexityConfig" else RunOptions)
    body = ast.parse(inspect.getsource(cls)).body[0].body
    declared = {item.target.id for item in body if isinstance(item, ast.AnnAssign)}
    assert not declared & {f.name for f in dataclasses.fields(LoadOptions)}
    assert issubclass(LoadOptions, WindowedRunOptions) and LoadOptions.of(cls()) == LoadOptions()


def _folder(path: Path, config: dict) -> str:
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def test_a_source_s_kind_is_chosen_from_the_flags_and_the_folder(tmp_path):
    from evalm.hf_folder import CheckedFolder
    from evalm.icl_eval.models.loading import SOURCES
    from evalm.icl_eval.models.source import folder_kind

    assert set(SOURCES) == set(KINDS)  # one loader per kind, no kind without one
    gpt2 = _folder(tmp_path / "gpt2", {"model_type": "gpt2"})
    assert ModelSource.of("ck", None, None, None).kind == "evalm"
    assert ModelSource.of(None, gpt2, None, "bytes").kind == "transformers"
    assert folder_kind(CheckedFolder(Path(gpt2), {"model_type": "gpt2"}, gguf_file="m.gguf"), "m.gguf") == "gguf"
    with pytest.raises(UserError, match="m.gguf|gguf package"):  # the gate reads --gguf-file with its folder, once
        ModelSource.of(None, gpt2, "m.gguf", None)
    assert ModelSource.of(None, _folder(tmp_path / "t5", {"model_type": "t5"}), None, None).kind == "t5"
    assert ModelSource.of(None, _folder(tmp_path / "ed", {"model_type": "bart", "is_encoder_decoder": True}), None, None).kind == "t5"
    assert ModelSource.of(None, None, None, None).kind == "tiny"
    assert ModelSource.of(None, str(tmp_path / "nowhere"), None, None).kind == "transformers"  # refused by its loader
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{not json")
    with pytest.raises(UserError, match="config.json"):
        ModelSource.of(None, str(tmp_path / "bad"), None, None)
    with pytest.raises(ValueError, match="valid: evalm"):
        ModelSource("onnx")


def test_the_resume_key_names_the_source_as_the_flags_did(tmp_path):
    """Run folders of earlier versions keyed the model by flag (checkpoint, hf_model, none): kept, so they resume."""
    from evalm.storage import RunFolder

    ck = models.byte_model(tmp_path / "ck")
    gpt2 = _folder(tmp_path / "gpt2", {"model_type": "gpt2"})
    with RunFolder(tmp_path / "out", "test").held() as folder:
        assert ModelSource.of(str(ck), None, None, None).key(folder)["kind"] == "checkpoint"
        assert ModelSource.of(None, gpt2, None, "bytes").key(folder) == {"kind": "hf_model",
                                                                       "files": folder.identity(gpt2),
                                                                       "tokenizer": "bytes"}
        assert ModelSource.of(None, None, None, None).key(folder) == {"kind": None, "files": None, "tokenizer": None}


def test_a_load_flag_is_its_section_key(tmp_path):
    """`--dtype float64` is `--ppl.dtype=float64`: the same scores, recorded with the flag as its source."""
    from evalm.icl_eval.cli import ppl

    ck = models.byte_model(tmp_path / "ck")
    (tmp_path / "book.txt").write_text("a book of words " * 40)
    common = ["--checkpoint", str(ck), "--books", str(tmp_path / "book.txt"), "--lengths", "64"]
    assert ppl([*common, "--dtype", "float64", "--out", str(tmp_path / "flag")]) == 0
    assert ppl([*common, "--ppl.dtype=float64", "--out", str(tmp_path / "key")]) == 0
    flag, key = (json.loads((tmp_path / name / "results.json").read_text()) for name in ("flag", "key"))
    assert flag["settings"]["values"]["ppl"]["dtype"] == "float64"
    assert flag["settings"]["sources"]["ppl.dtype"] == "--dtype" and key["settings"]["sources"]["ppl.dtype"] == "--ppl.dtype"
    assert _rounded(flag["protocols"]) == _rounded(key["protocols"])  # float64 sums over threads: equal to 1e-12


def _rounded(value):
    """`value` with every float to 12 significant digits (CPU reductions over threads may differ in the last ulp)."""
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value
