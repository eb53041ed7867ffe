"""config_toolkit: reading TOML and validating a section, against hand-written expectations.

Run: python -m pytest tests/config_toolkit -q
"""

from __future__ import annotations

import dataclasses

import pytest
from pydantic.dataclasses import dataclass

from pathlib import Path

from evalm.config_toolkit import FROZEN, ConfigError, build, read_toml, to_dict

ROOT = Path(__file__).resolve().parents[2]


@dataclass(config=FROZEN, frozen=True)
class Inner:
    width: int = 4
    name: str = "a"


@dataclass(config=FROZEN, frozen=True)
class Outer:
    steps: int = 10
    rate: float = 0.5
    inner: Inner = Inner()

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")


def test_read_toml_returns_the_tables(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[train]\nsteps = 3\nname = "x"\n[model]\nd = [1, 2]\n')
    assert read_toml(path) == {"train": {"steps": 3, "name": "x"}, "model": {"d": [1, 2]}}


def test_read_toml_missing_file_names_the_file(tmp_path):
    with pytest.raises(ConfigError) as err:
        read_toml(tmp_path / "absent.toml")
    assert str(err.value) == f"{tmp_path / 'absent.toml'}: config file not found"


def test_read_toml_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[train]\nsteps = 3\nrate = = 1\n")
    with pytest.raises(ConfigError) as err:
        read_toml(path)
    message = str(err.value)
    assert message.startswith(f"{path}: not valid TOML: ") and "line 3" in message
    assert "\n" not in message


def test_build_validates_into_a_frozen_dataclass():
    config = build(Outer, {"steps": 3, "inner": {"width": 7}}, where="run.toml [train]")
    assert config == Outer(steps=3, rate=0.5, inner=Inner(width=7, name="a"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.steps = 4
    assert build(Outer, None, where="x") == Outer()


def test_unknown_key_names_where_the_key_and_the_valid_keys():
    with pytest.raises(ConfigError) as err:
        build(Outer, {"step": 3}, where="run.toml [train]")
    assert str(err.value) == "run.toml [train]: unknown key(s) ['step']; valid keys: ['steps', 'rate', 'inner']"


def test_unknown_key_of_a_nested_section_is_named_with_its_field():
    with pytest.raises(ConfigError) as err:
        build(Outer, {"inner": {"wdth": 1}}, where="run.toml [train]")
    assert str(err.value) == "run.toml [train].inner: unknown key(s) ['wdth']; valid keys: ['width', 'name']"


def test_type_errors_and_checks_are_one_line_naming_the_key():
    with pytest.raises(ConfigError) as err:
        build(Outer, {"rate": "fast"}, where="f.toml [t]")
    message = str(err.value)
    assert message.startswith("f.toml [t]: rate: ") and "number" in message and "\n" not in message
    with pytest.raises(ConfigError) as err:
        build(Outer, {"steps": 0}, where="f.toml [t]")
    assert str(err.value) == "f.toml [t]: steps must be >= 1, got 0"  # pydantic's "Value error, " prefix dropped


def test_config_error_is_a_value_error_and_to_dict_is_json_ready():
    assert issubclass(ConfigError, ValueError)
    assert to_dict(Outer(steps=2)) == {"steps": 2, "rate": 0.5, "inner": {"width": 4, "name": "a"}}


def test_include_starts_from_another_file_and_own_values_win(tmp_path):
    (tmp_path / "base.toml").write_text('[model]\nd = 1\nw = 2\n[train]\nsteps = 5\n')
    path = tmp_path / "run.toml"
    path.write_text(f'include = ["{tmp_path / "base.toml"}"]\n[model]\nw = 3\n')
    assert read_toml(path) == {"model": {"d": 1, "w": 3}, "train": {"steps": 5}}
    path.write_text(f'include = ["{path}"]\n')
    with pytest.raises(ConfigError, match="includes itself"):
        read_toml(path)


def test_the_tiny_model_is_written_once():
    """The tiny run files take their shape from configs/model-tiny.toml and state only what differs."""
    import tomllib

    shape = read_toml("configs/model-tiny.toml")["model"]
    for name in ("pretrain-tiny", "msit-tiny", "eval-tiny"):
        raw = tomllib.loads((ROOT / "configs" / f"{name}.toml").read_text())
        assert raw["include"] == ["configs/model-tiny.toml"]
        assert not {"d_model", "n_layer", "n_head", "d_ff", "window_size", "chunk_size"} & set(raw["model"]), name
        assert {k: read_toml(ROOT / "configs" / f"{name}.toml")["model"][k] for k in ("d_model", "n_layer")} == \
            {"d_model": shape["d_model"], "n_layer": shape["n_layer"]}
    from evalm.icl_eval.settings import tiny_model

    assert {k: tiny_model()[k] for k in shape if k not in ("vocab_size", "circular_period")} == \
        {k: v for k, v in shape.items() if k not in ("vocab_size", "circular_period")}
