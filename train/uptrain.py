"""`evalm train uptrain`: a converted model (`evalm convert`) trained on with the project's trainer.

    evalm train uptrain --config configs/uptrain-smollm2-transfer.toml --out runs/uptrain   # [model] hf_model = a converted folder
    evalm train uptrain --config ... --out runs/uptrain --resume auto            # continue a run
    torchrun --nproc_per_node=2 -m evalm.train.uptrain --config ... --out ...    # FSDP2 over ranks

The loop, checkpoints and resume are the trainer's (train/trainer.py: FSDP2 per decoder layer then
the root, DCP checkpoints, bit-exact resume); what differs is the model, built from the `eva_llama`
folder `[model] hf_model`, and what trains (`[model] parameters`): `eva` (A_q/A_k and any T5 table
only), `lora` (LoRA adapters through `peft` on `lora_targets`, plus EVA's parameters; needs
`pip install 'evalm[lora]'`) or `full`. The objective (`[uptrain] objective`): `lm`, next-token
cross-entropy on the `[data]` token shards, or `attention-transfer`, LoLCATs' first stage
(train/attention_transfer.py), which trains EVA's parameters alone. After the last step the run's
model is written to OUT/hf as a converted folder (LoRA merged into its weights), ready for
`--hf-model OUT/hf` and for the next stage's `[model] hf_model`.

    evalm train uptrain --export-trainables --run RUN [--trainables FILE]              # its trainable tensors
    evalm train uptrain --rebuild --run RUN --hf-model CONVERTED [--trainables FILE]   # RUN/hf from them

A run trained on another machine comes home as its trainable tensors (LoRA adapters, EVA's maps: megabytes)
and its OUT/hf is rebuilt here from them and the same converted folder (`uptrain_model.save_trainables`,
`export_run`); the rebuild prints the weights digest, the same for the same weights on any machine.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass as _std_dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic.dataclasses import dataclass

from evalm.config_toolkit import FROZEN, ConfigError, InputError, MissingInput, apply_overrides, build
from evalm.config_toolkit import check_overrides, check_sections, read_toml, report, to_dict
from evalm.eva_settings import TrainingAblation
from evalm.storage import read_json
from evalm.config_toolkit.environment import command_environment
from evalm.train.config import CheckpointConfig, DataConfig, OptimConfig, RunConfig, TrainConfig

DEFAULT_CONFIG = "configs/uptrain-smollm2-transfer.toml"


@dataclass(config=FROZEN, frozen=True)
class UptrainModel:
    """`[model]` of an uptraining run: the converted folder and what of it trains."""

    hf_model: str = ""
    """An `eva_llama` folder written by `evalm convert` (or by an earlier uptraining run, OUT/hf)."""
    parameters: Literal["eva", "lora", "full"] = "eva"
    """What trains: EVA's A_q/A_k (and T5 table), LoRA adapters plus those, or every weight."""
    lora_rank: int = 8
    """LoRA rank r (parameters = "lora")."""
    lora_alpha: float = 16.0
    """LoRA scale alpha (the update is alpha / r x B A)."""
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    """Linear layers that get adapters (names inside each decoder layer)."""

    def __post_init__(self) -> None:
        if self.lora_rank < 1 or self.lora_alpha <= 0 or not self.lora_targets:
            raise ConfigError("need lora_rank >= 1, lora_alpha > 0 and at least one of lora_targets")

    def hf_config(self) -> dict[str, Any]:
        """The folder's config.json, refused in one line unless it is a converted (eva_llama) model."""
        path = Path(self.hf_model) / "config.json"
        if not self.hf_model or not path.is_file():
            raise MissingInput(f"[model] hf_model = {self.hf_model!r}: no config.json there; name the folder "
                               "`evalm convert` wrote")
        config = read_json(path)
        if config.get("model_type") != "eva_llama":
            raise ConfigError(f"{path}: model_type {config.get('model_type')!r}; uptraining takes a converted model "
                              "(model_type 'eva_llama'): run `evalm convert --hf-model DIR --out DIR` first")
        return config

    @property
    def n_layer(self) -> int:
        return int(self.hf_config()["num_hidden_layers"])

    @property
    def d_model(self) -> int:
        return int(self.hf_config()["hidden_size"])

    @property
    def vocab_size(self) -> int:
        return int(self.hf_config()["vocab_size"])

    @property
    def d_ff(self) -> int:
        return int(self.hf_config()["intermediate_size"])


@dataclass(config=FROZEN, frozen=True)
class UptrainSection:
    """`[uptrain]`: the objective."""

    objective: Literal["lm", "attention-transfer"] = "lm"
    """Next-token cross-entropy, or LoLCATs' attention transfer (EVA's parameters only)."""
    summary_noise: bool = False
    """EVA's training noise ε on the summaries (as EVA trains from scratch); off: the summaries as evaluated."""
    eva_ablation: TrainingAblation = "none"
    """Train with EVA's summaries (`none`) or without them (`no-remote`: the window and sink alone, the control of
    a conversion study: what LoRA makes of a window-only model). Evaluate such a run with `--eva-ablation
    no-remote` too; its convert.json records the setting."""

    def __post_init__(self) -> None:
        if self.eva_ablation != "none" and self.objective == "attention-transfer":
            raise ConfigError(f"eva_ablation = {self.eva_ablation!r} with objective 'attention-transfer': the "
                              "transfer trains the summary maps, which the ablation never reads; use objective 'lm'")


@_std_dataclass(frozen=True)
class UptrainConfig(RunConfig):
    """A run file of `evalm train uptrain`: the trainer's sections and `[uptrain]`."""

    uptrain: UptrainSection = UptrainSection()

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "uptrain": to_dict(self.uptrain)}

    def inputs(self) -> list[str]:
        return [*super().inputs(), self.model.hf_model]

    def identity(self, digest) -> dict[str, str]:
        """The pretraining identity (tokenizer, data) and what an uptraining run starts from and aims at: the
        converted folder by content (weights replaced in place under the same name are another start) and
        the objective (a run resumed under another trains toward something else)."""
        return {**super().identity(digest), "weights": digest(Path(self.model.hf_model)) or "missing",
                "objective": self.uptrain.objective}


SECTIONS = {"model": UptrainModel, "data": DataConfig, "optim": OptimConfig, "train": TrainConfig,
            "checkpoint": CheckpointConfig, "uptrain": UptrainSection}


def load_config(path: str | Path, overrides: list[str], data_cls: type = DataConfig) -> UptrainConfig:
    """Read an uptraining run file, apply overrides, validate each section; the shards must be of the
    converted model's tokenizer."""
    check_overrides(overrides, SECTIONS)
    raw = apply_overrides(read_toml(path), overrides)
    check_sections(raw, tuple(SECTIONS), str(path))
    built = {name: build(cls, raw.get(name), where=f"{path} [{name}]") for name, cls in SECTIONS.items()}
    config = UptrainConfig(**built)
    config.model.hf_config()
    if config.uptrain.objective == "attention-transfer" and config.model.parameters != "eva":
        raise ConfigError(f"{path}: [uptrain] objective 'attention-transfer' trains EVA's parameters alone; set "
                          "[model] parameters = \"eva\" (LoRA or full training is the next stage, objective 'lm')")
    if config.train.compile:  # said, not ignored: the blocks compiled are the project's own (train/parallelize.py)
        raise ConfigError(f"{path}: [train] compile = true is not applied by uptraining (its decoder layers are "
                          "transformers' Llama layers, which the trainer does not compile); set train.compile=false")
    if config.checkpoint.init_from:
        raise ConfigError(f"{path}: [checkpoint] init_from is not used by uptraining; [model] hf_model names the "
                          "weights it starts from")
    check_shards(config.data.shards, config.model.hf_model)
    return config


def run_config(run: str | Path, hf_model: str | Path | None = None) -> UptrainConfig:
    """The validated config of uptraining run RUN, rebuilt from the config.json it wrote (its sections; what
    else the file records is not config); `hf_model` names its converted folder here, when the run was made
    on another machine, where the folder had another path."""
    where = Path(run) / "config.json"
    if not where.is_file():
        raise MissingInput(f"{where} not found: --run names the folder of an `evalm train uptrain` run (its --out)")
    raw = read_json(where, "a run's config.json")
    missing = [name for name in SECTIONS if not isinstance(raw.get(name), dict)] if isinstance(raw, dict) else list(SECTIONS)
    if missing:
        raise InputError(f"{where}: no {missing} section(s); is {run} a folder `evalm train uptrain` wrote?")
    if hf_model is not None:
        raw["model"]["hf_model"] = str(hf_model)
    return UptrainConfig(**{name: build(cls, raw[name], where=f"{where} [{name}]") for name, cls in SECTIONS.items()})


def _same_vocabulary(path: Path, tok) -> bool:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path)).get_vocab() == tok.get_vocab()
    except Exception:  # noqa: BLE001 - a file the manifest names that does not load is not the model's tokenizer
        return False


def check_shards(shards: str | Path, hf_model: str | Path) -> None:
    """Token shards written with the converted model's tokenizer, else one line: shards of another tokenizer
    (a vocabulary of 64 under a model of 49,152) trained without a word. The manifest's vocabulary size
    against the folder's tokenizer, and, when the manifest names a tokenizer file that is there, its
    vocabulary, token by token (the end-of-document id may differ: a choice of the encoding, not another
    tokenizer)."""
    from evalm.hf_folder import tokenizer as folder_tokenizer

    manifest_path = Path(shards) / "manifest.json"
    if not manifest_path.is_file():
        return  # the loader refuses a folder without its manifest, naming it
    manifest = read_json(manifest_path)
    tok = folder_tokenizer(hf_model)
    wrong = [f"vocab_size: shards {manifest.get('vocab_size')!r}, model {len(tok)}"] \
        if manifest.get("vocab_size") != len(tok) else []
    named = Path(str(manifest.get("tokenizer", "")))
    if not wrong and named.suffix == ".json" and named.is_file() and not _same_vocabulary(named, tok):
        wrong.append(f"{named} maps tokens to other ids than the model's tokenizer")
    if wrong:
        raise ConfigError(f"[data] shards = {str(shards)!r} were written with another tokenizer than [model] hf_model "
                          f"= {str(hf_model)!r} ({'; '.join(wrong)}); encode the documents with the converted model's "
                          f"tokenizer: evalm train tokenizer --input DOCS --output DIR --tokenizer {Path(hf_model) / 'tokenizer.json'}")


def run_options(config: UptrainConfig) -> dict[str, Any]:
    """The trainer's model builder and, for attention transfer, its step."""
    from evalm.train.attention_transfer import transfer_step
    from evalm.train.uptrain_model import build_sharded

    step = transfer_step if config.uptrain.objective == "attention-transfer" else None
    return {"build": build_sharded, "step": step}


def bring_home(argv: Sequence[str]) -> int:
    """`--export-trainables` / `--rebuild`: a run's trainable tensors written to a small file, or its OUT/hf
    rebuilt from them (on the machine the file was brought to); neither trains."""
    from evalm.config_toolkit import Parser
    from evalm.storage import weights_digest
    from evalm.train.uptrain_model import export_run, save_trainables

    p = Parser(prog="evalm train uptrain", description=bring_home.__doc__)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--export-trainables", action="store_true", help="write RUN's trainable tensors (LoRA adapters, "
                      "EVA's maps) from its newest checkpoint to --trainables (one of the two is required)")
    mode.add_argument("--rebuild", action="store_true", help="write RUN/hf from its converted folder and --trainables (one of the two is "
                      "required)")
    p.add_argument("--run", "--out", dest="run", type=Path, required=True,
                   help="the uptraining run's folder (its --out), read and written inside (required)")
    p.add_argument("--hf-model", type=Path, help="its converted folder on this machine (default: the path the run "
                                                  "recorded in its config.json)")
    p.add_argument("--trainables", type=Path, help="the trainables file (default: RUN/trainables.safetensors)")
    args = p.parse_args(list(argv))
    try:
        config = run_config(args.run, args.hf_model)
        trainables = args.trainables or args.run / "trainables.safetensors"
        if args.export_trainables:
            print(f"wrote {save_trainables(args.run, config, trainables)}")
        else:
            out = export_run(args.run, config, trainables)
            print(f"wrote {out}; weights sha256 {weights_digest(out)}")
    except Exception as err:  # noqa: BLE001 - the one rule
        return report("evalm train uptrain", err)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from evalm.config_toolkit import Parser
    from evalm.train.command import TrainCommand, parse_run_args, run_command

    argv = list(argv if argv is not None else sys.argv[1:])
    modes = Parser(add_help=False)
    modes.add_argument("--export-trainables", "--rebuild", dest="home", action="store_true")
    if modes.parse_known_args(argv)[0].home:  # the run brought home, not trained
        return bring_home(argv)
    from evalm.train.pretrain import make_source

    command = TrainCommand("uptrain", __doc__, DEFAULT_CONFIG, make_source, sections=SECTIONS, load=load_config,
                           options=run_options)
    status = run_command(argv, command)
    if status or int(os.environ.get("RANK", "0")):
        return status
    config, out, _ = parse_run_args(argv, command)
    try:
        from evalm.train.uptrain_model import export_run

        print(f"wrote {export_run(out, config)}", file=sys.stderr)
    except Exception as err:  # noqa: BLE001 - the one rule
        return report("evalm train uptrain", err)
    return 0


if __name__ == "__main__":
    command_environment()
    sys.exit(main())
