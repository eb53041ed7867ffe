"""`evalm export`: a DCP training checkpoint -> `model.safetensors` + `config.json` (+ tokenizer).

    evalm export --checkpoint runs/tiny/msit --out runs/tiny/model

`--checkpoint` is a complete `step-XXXXXXXX` folder or a run folder (its latest complete one). The
sharded checkpoint of any number of ranks is read in one process; the architecture comes from the
checkpoint's own config.json. The run's tokenizer (`[data] tokenizer`, or `tokenizer.json` beside
the `[data] shards`) is copied along, so `evalm eval --checkpoint OUT` needs nothing else.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from evalm.config_toolkit import Parser, build, report
from evalm import EvalmModel, ModelConfig
from evalm.io import save_model
from evalm.storage import RunFolder, read_json, replaced
from evalm.train.identity import run_tokenizer


def export(checkpoint: str | Path, out: str | Path, tokenizer: str | Path | None = None) -> Path:
    from evalm.train.checkpoint import load_model_only, resolve_checkpoint

    path = resolve_checkpoint(checkpoint, note=lambda text: print(f"evalm export: {text}", file=sys.stderr))
    run_config = read_json(path / "config.json")
    config = build(ModelConfig, run_config["model"], where=f"{path / 'config.json'} [model]")
    model = EvalmModel(config)
    load_model_only(path, model)
    with RunFolder(out, "evalm export").held() as folder:
        out = save_model(model.eval(), folder.path)
        source = Path(tokenizer) if tokenizer else run_tokenizer(run_config.get("data", {}))
        if source is not None:
            with replaced(out / "tokenizer.json") as tmp:
                shutil.copyfile(source, tmp)
        folder.write_json("export.json", {"checkpoint": str(path), "tokenizer": str(source) if source else None})
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="evalm export", description=__doc__)
    parser.add_argument("--checkpoint", required=True, metavar="DIR",
                        help="step-XXXXXXXX folder, or a run folder (its latest complete checkpoint) (required)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="folder for model.safetensors, config.json, tokenizer.json (required)")
    parser.add_argument("--tokenizer", help="tokenizer.json to copy (default: the one the run trained with)")
    args = parser.parse_args(argv)
    try:
        out = export(args.checkpoint, args.out, args.tokenizer)
    except Exception as err:  # noqa: BLE001 - `evalm run` calls this without a dispatcher above: the one rule
        return report("evalm export", err)
    print(f"exported {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
