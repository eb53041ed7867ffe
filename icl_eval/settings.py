"""Effective settings of `evalm eval icl|ppl`: built-in defaults < the `--config` file < flags.

A config file is read only when `--config` names one (an implicit tiny config once silently
capped paper-scale runs). Each value remembers where it came from, the command prints every
section in one block before it starts, and `results.json` keeps the same block under `settings`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from evalm.config_toolkit import ConfigError, apply_overrides, check_overrides, check_sections, read_toml, to_dict
from evalm.config_toolkit.shipped import package_config


def tiny_model() -> dict[str, Any]:
    """`[model]` of the built-in default (no --checkpoint/--hf-model): a byte-level EVALM small enough
    to train on the synthetic family in about 30 s on a CPU. Its shape is the shipped
    `configs/model-tiny.toml`, read from the package, never from the working directory."""
    return {**read_toml(package_config("model-tiny.toml"))["model"], "vocab_size": 257,
            "circular_period": 512, "dropout": 0.0, "attn_dropout": 0.0}


TINY_SYNTHETIC_TRAINING: dict[str, Any] = {"train_steps": 500, "batch_size": 16, "train_shots": 32}
"""`[synthetic]` training knobs of that built-in default (the family itself keeps its defaults)."""


FILE_SECTIONS = ("eval", "eval.method", "ppl", "recall", "model", "synthetic")
"""The sections of an `evalm eval` settings file: one file serves `icl`, `ppl` and `recall` (configs/eval-tiny.toml),
so each command reads its own sections of it and leaves the other's."""


def section_classes(sections: Sequence[str]) -> dict[str, type]:
    """The config class of each of `sections`."""
    from evalm import ModelConfig
    from evalm.icl_eval.config import EvalConfig, PerplexityConfig
    from evalm.icl_eval.methods.options import MethodOptions
    from evalm.icl_eval.recall.config import RecallConfig
    from evalm.text.synthetic import SyntheticConfig

    classes = {"eval": EvalConfig, "eval.method": MethodOptions, "ppl": PerplexityConfig, "recall": RecallConfig,
               "model": ModelConfig, "synthetic": SyntheticConfig}
    return {name: classes[name] for name in sections}


class Layers:
    """Raw sections (nested dicts) with the source of every value that is not a built-in default."""

    def __init__(self, config: str | None, overrides: Sequence[str], sections: Sequence[str]):
        """`sections`: the command's own sections (dotted for a sub-section, `eval.method`). A file section
        outside FILE_SECTIONS, or a flag's outside the command's own, is refused as training refuses it
        (`config_toolkit.check_sections`): a misspelled `--evl.seeds` was once ignored, and ran the defaults."""
        self.config, self.sections = config, tuple(sections)
        self.data: dict[str, Any] = read_toml(config) if config else {}
        check_sections(self.data, FILE_SECTIONS, f"--config {config}")
        names = [item.partition("=")[0].strip() for item in overrides]
        stray = [n for n in names if n.split(".")[0] not in {s.split(".")[0] for s in self.sections}]
        check_sections({n.split(".")[0]: None for n in stray}, self.sections, ", ".join(f"--{n}" for n in stray))
        check_overrides(overrides, section_classes(self.sections))  # a misspelled key is the flag's, not the file's
        self.sources: dict[str, str] = {key: "config" for key in _leaves(self.data)}
        self.data = apply_overrides(self.data, overrides)
        self.sources.update({name: f"--{name}" for name in names})

    def section(self, dotted: str) -> dict[str, Any]:
        """A copy of one section (`eval.method` is the table inside `[eval]`) without its sub-sections;
        a table that is no sub-section (`--eval.methd.scoring=...`) stays, for `build` to refuse as an
        unknown key."""
        node: Any = self.data
        for name in dotted.split("."):
            node = node.get(name, {})
            if not isinstance(node, Mapping):
                raise ConfigError(f"[{dotted}] must be a table of settings, got {node!r}")
        return {k: v for k, v in node.items() if f"{dotted}.{k}" not in self.sections}

    def set_flag(self, dotted: str, key: str, value: Any, flag: str) -> None:
        """A command-line flag's value: it wins over the file."""
        node = self.data
        for name in dotted.split("."):
            node = node.setdefault(name, {})
        node[key] = value
        self.sources[f"{dotted}.{key}"] = flag


def _leaves(data: Mapping[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, value in data.items():
        out += _leaves(value, f"{prefix}{key}.") if isinstance(value, Mapping) else [f"{prefix}{key}"]
    return out


UNSET_UNRECORDED = ("eva_select",)
"""Fields recorded only when set: added after runs were made, unset they change nothing, so a folder made before
them keeps its settings (and its resume key) unchanged."""


def recorded_fields(fields: Any) -> Any:
    """A section's fields as recorded: those of `UNSET_UNRECORDED` dropped while unset."""
    if not isinstance(fields, dict):
        return fields
    return {k: v for k, v in fields.items() if not (k in UNSET_UNRECORDED and v is None)}


def record(layers: Layers, built: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The effective settings: every field of every section used (those of `UNSET_UNRECORDED` only when set), and
    where each non-default came from."""
    values = {name: recorded_fields(to_dict(obj) if obj is not None and not isinstance(obj, dict) else obj)
              for name, obj in built.items()}
    sources = {key: how for key, how in layers.sources.items() if key.rsplit(".", 1)[0] in values}
    return {"config": layers.config, "values": values, "sources": sources, **(extra or {})}


def render(command: str, settings: Mapping[str, Any]) -> str:
    """One block: a header naming the config file, then `section.key = value  (source)` lines."""
    where = settings["config"] or "none"
    lines = [f"{command} settings (built-in defaults < --config {where} < flags):"]
    for section, fields in settings["values"].items():
        for key, value in (fields or {}).items():
            source = settings["sources"].get(f"{section}.{key}", "default")
            lines.append(f"  {section}.{key} = {value!r}  ({source})")
    for key, value in settings.items():
        if key not in ("config", "values", "sources"):
            lines.append(f"  {key}: {value}")
    return "\n".join(lines)


def built_in_sections(layers, tiny: bool, where: str, need_synthetic: bool):
    """`[model]` of the built-in tiny model (`tiny`: no --checkpoint/--hf-model) and `[synthetic]`, when used:
    what `icl`, `ppl` and `recall` build before anything else."""
    from evalm import ModelConfig
    from evalm.config_toolkit import build
    from evalm.icl_eval.tasks.synthetic import SyntheticConfig

    model = build(ModelConfig, {**tiny_model(), **layers.section("model")}, where=f"{where} [model]") if tiny else None
    syn = build(SyntheticConfig, {**TINY_SYNTHETIC_TRAINING, **layers.section("synthetic")},
                where=f"{where} [synthetic]") if tiny or need_synthetic else None
    if model is not None:  # `--set model.n_layer=1e9` grew for minutes without a line: refused before anything is built
        from evalm.footprint import check_fits, parameters, training_bytes

        n = parameters(model.vocab_size, model.d_model, model.n_layer, model.d_ff)
        check_fits(training_bytes(n, model.vocab_size, syn.batch_size * syn.train_shots * 2),
                   f"{where} [model]: the built-in model of about {n:.3g} parameters, trained here first")
    return model, syn
