"""The model of an uptraining run (train/uptrain.py): a converted folder, what of it trains, sharded;
and the run's last checkpoint written back as a converted folder (OUT/hf).

`CausalLMLogits` wraps the `transformers` model so that the trainer's step sees what it sees in
pretraining, a module mapping tokens (B, T) to logits (B, T, V). FSDP2 (torchtitan's order, as
train/parallelize.py): each decoder layer its own unit, resharded after forward, then the root
(embeddings, final norm, the tied LM head). Frozen weights are sharded alike; only the trainable
ones have gradients to reduce. Every rank loads the folder and draws LoRA's initial adapters from
the same seed, so the weights agree before sharding.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from evalm.config_toolkit import ConfigError, InputError, MissingExtra
from evalm.hf_private import set_attention
from evalm.storage import read_json
from evalm.train.attention_transfer import EVA_PARAMETER, eva_parameters, use_transfer

class CausalLMLogits(nn.Module):
    """A `transformers` causal LM as tokens -> logits (no cache: the whole-sequence path). Without
    `summary_noise` EVA's parts stay in eval mode when the model trains: no random-feature noise ε on
    the summaries' ω (docs/eva.md), so uptraining fits the summaries the evaluation uses."""

    def __init__(self, hf: nn.Module, summary_noise: bool = False):
        super().__init__()
        self.hf, self.summary_noise = hf, summary_noise

    def train(self, mode: bool = True) -> CausalLMLogits:
        super().train(mode)
        if not self.summary_noise:
            for name, module in self.named_modules():
                if name.endswith(".eva"):
                    module.train(False)
        return self

    def forward(self, tokens: Tensor, logits_to_keep: int = 0) -> Tensor:
        return self.hf(input_ids=tokens, use_cache=False, logits_to_keep=logits_to_keep).logits


def load_converted(folder: str | Path):
    """The converted model of `folder` in float32, through evalm's classes (no code from the folder; its
    weights checked against its config.json first: evalm.hf_folder)."""
    from evalm import hf_folder, register_with_transformers
    from evalm.hf_attention import transformers_module
    from evalm.hf_llama import EvaLlamaForCausalLM

    transformers_module()
    register_with_transformers()
    return hf_folder.model(EvaLlamaForCausalLM, folder, dtype=torch.float32)


def check_targets(hf: nn.Module, targets) -> None:
    """Every name of `lora_targets` names a linear layer of the model: peft's own refusal of an unknown one
    ended as a bug line."""
    linear = sorted({name.rsplit(".", 1)[-1] for name, m in hf.named_modules() if isinstance(m, nn.Linear)})
    unknown = [t for t in targets if t not in linear]
    if unknown:
        raise ConfigError(f"[model] lora_targets {unknown}: no linear layer of the model has that name; valid: {linear}")


def with_trainable(hf: nn.Module, model_config, seed: int) -> nn.Module:
    """`hf` with only `model_config.parameters` trainable: EVA's, LoRA adapters and EVA's, or all."""
    if model_config.parameters == "lora":
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError as err:
            raise MissingExtra("[model] parameters = \"lora\" needs peft: pip install 'evalm[lora]'") from err
        check_targets(hf, model_config.lora_targets)
        torch.manual_seed(seed)  # the same adapters on every rank
        hf = get_peft_model(hf, LoraConfig(r=model_config.lora_rank, lora_alpha=model_config.lora_alpha,
                                           target_modules=list(model_config.lora_targets), lora_dropout=0.0))
    for name, p in hf.named_parameters():
        p.requires_grad_(model_config.parameters == "full" or EVA_PARAMETER in name or "lora_" in name)
    return hf


def decoder_layers(hf: nn.Module) -> nn.ModuleList:
    """The decoder layers of a (possibly peft-wrapped) Llama."""
    base = hf.get_base_model() if hasattr(hf, "get_base_model") else hf
    return base.model.layers


def enable_checkpointing(hf: nn.Module) -> None:
    """Recompute each decoder layer in backward: transformers 5.x's `activation_checkpointing_enable`, or the
    name it had before (4.x, deprecated in 5.x)."""
    kwargs = {"use_reentrant": False}
    if hasattr(hf, "activation_checkpointing_enable"):
        hf.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        hf.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def build_sharded(config, runtime) -> nn.Module:
    """The trainer's model of an uptraining run (`trainer.RunOptions.build`): loaded, trainable set, sharded."""
    tcfg = config.train
    hf = with_trainable(load_converted(config.model.hf_model), config.model, tcfg.seed)
    if config.uptrain.eva_ablation != "none":  # the control: LoRA on the window (and sink) alone
        from evalm.eva import ablate

        ablate(hf, config.uptrain.eva_ablation)
    if config.uptrain.objective == "attention-transfer":
        if tcfg.activation_checkpointing:
            from evalm.config_toolkit import ConfigError

            raise ConfigError("attention transfer keeps no activations to recompute (it trains EVA's maps on the "
                              "attention calls alone); set train.activation_checkpointing=false")
        use_transfer(hf)
    elif tcfg.activation_checkpointing:
        enable_checkpointing(hf)
    model = CausalLMLogits(hf, config.uptrain.summary_noise).train()
    bf16 = tcfg.mixed_precision == "bf16"
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    # [transfer note] the transfer loss reaches no layer output, so FSDP's backward hooks (unshard,
    # reduce-scatter) never fire: EVA's maps stay out of the units, whole on every rank, and the
    # step averages their gradients itself (attention_transfer.transfer_step)
    ignored = set(eva_parameters(model)) if config.uptrain.objective == "attention-transfer" else None
    for layer in decoder_layers(hf):
        fully_shard(layer, mesh=runtime.mesh, mp_policy=policy, reshard_after_forward=True, ignored_params=ignored)
    fully_shard(model, mesh=runtime.mesh, mp_policy=policy, reshard_after_forward=False, ignored_params=ignored)
    return model


def trained_model(out: str | Path, config, trainables: str | Path | None = None):
    """The run's model, its newest intact checkpoint loaded (or, given `trainables`, the file of
    `save_trainables`), LoRA not yet merged; with where its weights came from. One process."""
    from evalm.train.checkpoint import load_model_only, resolve_checkpoint

    hf = with_trainable(load_converted(config.model.hf_model), config.model, config.train.seed)
    if trainables is None:
        path = resolve_checkpoint(out)
        load_model_only(path, CausalLMLogits(hf))
        return hf, {"checkpoint": str(path), "config": read_json(path / "config.json")}
    from safetensors.torch import load_file

    from safetensors import SafetensorError

    check_run(trainables, config)
    try:
        tensors = load_file(str(trainables))
    except (SafetensorError, OSError, ValueError) as err:  # a file cut short after its header
        raise InputError(f"{trainables}: not a readable safetensors file ({str(err)[:120]}); write it again with "
                         "save_trainables") from None
    check_tensors(trainables, tensors, trainable_tensors(hf))
    hf.load_state_dict(tensors, strict=False)
    return hf, {"trainables": str(trainables)}


def check_tensors(path: str | Path, tensors: dict[str, Tensor], expected: dict[str, Tensor]) -> None:
    """Refuse trainable tensors that would make a broken model, before anything is written: other names than
    the run's (another run's file, another [model] section), a shape that is not the parameter's, a dtype that
    is not floating point (an int32 tensor loaded by casting), a NaN or an infinity (a diverged run)."""
    if set(tensors) != set(expected):
        raise InputError(f"{path}: its tensors are not this run's trainable ones "
                         f"({len(set(tensors) - set(expected))} unexpected, {len(set(expected) - set(tensors))} "
                         "missing); write it from this run with save_trainables")
    for name, tensor in tensors.items():
        why = (f"shape {tuple(tensor.shape)}, the parameter's is {tuple(expected[name].shape)}"
               if tensor.shape != expected[name].shape else
               f"dtype {tensor.dtype}, not floating point" if not tensor.is_floating_point() else
               "NaN or infinite values" if not bool(torch.isfinite(tensor).all()) else None)
        if why:
            raise InputError(f"{path}: tensor {name!r} has {why}; write the file again from a good checkpoint "
                             "with save_trainables (`evalm train uptrain --export-trainables`)")


def trainable_tensors(hf: nn.Module) -> dict[str, Tensor]:
    """What a run trains (`with_trainable`'s choice), by parameter name: what `save_trainables` keeps."""
    return {name: p.detach().contiguous() for name, p in hf.named_parameters() if p.requires_grad}


RUN_KEY = "evalm.run"
"""Metadata key of a trainables file: the run key (`run_key`) of the run that wrote it."""


def run_key(config) -> str:
    """What makes trainable tensors one run's, by content, the same on every machine: the converted folder's
    files (their SHA-256), every setting of [model], [optim], [train], [uptrain] and the non-path settings of
    [data] (paths differ between machines; the files' content is in the weights' identity and the run's
    checkpoint). Not the device or how often it logs."""
    import hashlib

    from evalm.config_toolkit import to_dict
    from evalm.storage import identity

    model = {k: v for k, v in to_dict(config.model).items() if k != "hf_model"}
    train = {k: v for k, v in to_dict(config.train).items() if k not in ("device", "log_every", "tensorboard", "compile")}
    data = {k: v for k, v in to_dict(config.data).items() if not isinstance(v, str)}
    record = {"weights": identity(Path(config.model.hf_model)), "model": model, "optim": to_dict(config.optim),
              "train": train, "uptrain": to_dict(config.uptrain), "data": data}
    return "sha256:" + hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()


def check_run(trainables: str | Path, config) -> None:
    """Refuse a trainables file that another run wrote (or one written before files named their run): its
    tensors have this run's names and shapes whenever the [model] sections agree, so they loaded silently."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(trainables), framework="pt") as f:
            meta = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as err:
        raise InputError(f"{trainables}: not a readable safetensors file ({str(err)[:120]}); write it with "
                         "save_trainables") from None
    recorded, now = meta.get(RUN_KEY), run_key(config)
    if recorded != now:
        whose = (f"run {meta.get('run', '?')} (key {recorded[:19]}..., this run's {now[:19]}...)" if recorded
                 else "a run that did not record itself")
        raise InputError(f"{trainables}: written by {whose}; its tensors are another run's: write the file from this "
                         "run with save_trainables, or pass the run file it was trained with")


def check_destination(dest: str | Path, inputs) -> None:
    """Where `save_trainables` may write: never an input of the run (the converted folder, its checkpoints) nor a
    file inside one, and over an existing file only when it is a trainables file (one that names its run):
    `--trainables FILE` replaced any file, the converted model's model.safetensors included."""
    from safetensors import SafetensorError, safe_open

    from evalm.storage import inside, refuse_link

    dest = refuse_link(dest)
    for path in inputs:
        if inside(dest, path):
            raise InputError(f"--trainables {dest} lies inside {path}, which the run reads; choose a file outside "
                             "it (default: RUN/trainables.safetensors)")
    if not dest.exists():
        return
    try:
        with safe_open(str(dest), framework="pt") as f:
            ours = RUN_KEY in (f.metadata() or {})
    except (SafetensorError, OSError, ValueError):
        ours = False
    if not ours:
        raise InputError(f"--trainables {dest} exists and is no trainables file (save_trainables names its run in "
                         "it); choose another file, or delete it yourself if it is disposable")


def save_trainables(out: str | Path, config, dest: str | Path) -> Path:
    """The trainable tensors of run `out`'s newest checkpoint (LoRA adapters and EVA's maps: megabytes where
    the whole model is hundreds), so a run trained on another machine is rebuilt here with
    `export_run(..., trainables=dest)` from the same converted folder; the file names its run (`run_key`)."""
    from safetensors.torch import save_file

    from evalm.storage import replaced

    check_destination(dest, [config.model.hf_model, Path(out) / "checkpoints"])
    hf, source = trained_model(out, config)
    with replaced(dest) as tmp:
        save_file(trainable_tensors(hf), str(tmp), metadata={"checkpoint": source["checkpoint"], "run": str(out),
                                                              RUN_KEY: run_key(config)})
    return Path(dest)


def export_run(out: str | Path, config, trainables: str | Path | None = None) -> Path:
    """Write the run's trained model (`trained_model`) as a converted folder OUT/hf (LoRA merged); one process."""
    from evalm import hf_folder
    from evalm.train.convert import save_converted

    hf, weights = trained_model(out, config, trainables)
    if hasattr(hf, "merge_and_unload"):
        hf = hf.merge_and_unload()
    set_attention(hf.config, "eva")  # a transfer run ran it as "eva_transfer"
    source = Path(config.model.hf_model)
    record = {"source": str(source), "uptrained": {"run": str(out), **weights},
              "convert": _read(source / "convert.json")}
    return save_converted(hf.requires_grad_(False).eval(), hf_folder.tokenizer(source), Path(out) / "hf", record)


def _read(path: Path):
    return read_json(path) if path.is_file() else None
