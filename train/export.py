"""`evalm export`: a DCP training checkpoint -> `model.safetensors` + `config.json` (+ tokenizer).

    evalm export --checkpoint runs/tiny/msit --out runs/tiny/model
    evalm export --hf --checkpoint runs/tiny/msit --out runs/tiny/hf   # a transformers folder (train/hf_export.py)
    evalm export --digest runs/tiny/hf                                 # an exported folder's weights digest

`--checkpoint` is a complete `step-XXXXXXXX` folder or a run folder (its latest complete one). The
sharded checkpoint of any number of ranks is read in one process; the architecture comes from the
checkpoint's own config.json. The run's tokenizer (`[data] tokenizer`, or `tokenizer.json` beside
the `[data] shards`) is copied along, so `evalm eval --checkpoint OUT` needs nothing else.

`--digest FOLDER` prints the SHA-256 of a folder's tensors (names, dtypes, shapes and bytes:
`storage.weights_digest`), the same for the same weights on any machine whatever the file's metadata,
so an export (or a conversion, a rebuilt uptraining run) made elsewhere is checked against this one.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from evalm.config_toolkit import Parser, build, report
from evalm import EvalmModel, ModelConfig
from evalm.io import save_model
from evalm.storage import RunFolder, read_json, regular, staged, write_json
from evalm.train.identity import run_tokenizer


def checkpoint_model(checkpoint: str | Path) -> tuple[EvalmModel, Path, dict]:
    """The model of a training checkpoint, the complete checkpoint folder it came from, its run config."""
    from evalm.train.checkpoint import load_model_only, resolve_checkpoint

    path = resolve_checkpoint(checkpoint, note=lambda text: print(f"evalm export: {text}", file=sys.stderr))
    run_config = read_json(path / "config.json")
    config = build(ModelConfig, run_config["model"], where=f"{path / 'config.json'} [model]")
    model = EvalmModel(config)
    load_model_only(path, model)
    return model, path, run_config


def export(checkpoint: str | Path, out: str | Path, tokenizer: str | Path | None = None) -> Path:
    model, path, run_config = checkpoint_model(checkpoint)
    source = Path(tokenizer) if tokenizer else run_tokenizer(run_config.get("data", {}))
    with RunFolder(out, "evalm export", inputs=[checkpoint, path]).held() as folder, staged(folder.path) as stage:
        save_model(model.eval(), stage)  # moved into OUT complete, config.json last, never through a link
        if source is not None:
            shutil.copyfile(regular(source, "--tokenizer"), stage / "tokenizer.json")
        write_json(stage / "export.json", {"checkpoint": str(path), "tokenizer": str(source) if source else None})
    return folder.path


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="evalm export", description=__doc__)
    parser.add_argument("--checkpoint", metavar="DIR",
                        help="step-XXXXXXXX folder, or a run folder (its latest complete checkpoint) (required but "
                             "with --digest)")
    parser.add_argument("--out", metavar="DIR",
                        help="folder for model.safetensors, config.json, tokenizer.json (required but with --digest)")
    parser.add_argument("--digest", action="store_true",
                        help="print the weights digest of FOLDER instead (its model.safetensors; "
                             "storage.weights_digest) and write nothing (default: off)")
    parser.add_argument("folder", nargs="?", metavar="FOLDER", help="the folder --digest reads (required there)")
    parser.add_argument("--tokenizer", help="tokenizer.json to copy (default: the one the run trained with)")
    parser.add_argument("--hf", action="store_true",
                        help="write a transformers model folder (AutoModelForCausalLM, trust_remote_code=True); "
                             "--checkpoint may then also be an exported folder (default: off)")
    args = parser.parse_args(argv)
    if not args.digest and not (args.checkpoint and args.out) or bool(args.digest) != bool(args.folder):
        parser.error("give --checkpoint DIR --out DIR, or --digest FOLDER")
    try:
        if args.digest:
            from evalm.config_toolkit import MissingInput
            from evalm.storage import weights_digest

            if not (Path(args.folder) / "model.safetensors").exists():
                raise MissingInput(f"{args.folder}: no model.safetensors; --digest names an exported or converted folder")
            print(f"weights sha256 {weights_digest(args.folder)}")
            return 0
        if args.hf:
            from evalm.train.hf_export import export_hf

            out = export_hf(args.checkpoint, args.out, args.tokenizer, load=checkpoint_model)
        else:
            out = export(args.checkpoint, args.out, args.tokenizer)
    except Exception as err:  # noqa: BLE001 - `evalm run` calls this without a dispatcher above: the one rule
        return report("evalm export", err)
    print(f"exported {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
