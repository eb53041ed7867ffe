"""config_toolkit: `section.key=value` overrides, parsed as TOML values.

Run: python -m pytest tests/config_toolkit/test_overrides.py -q
"""

from __future__ import annotations

import pytest

from evalm.config_toolkit import ConfigError, apply_overrides, split_overrides


def test_values_are_parsed_as_toml_else_kept_as_strings():
    data = {"train": {"steps": 1}}
    out = apply_overrides(data, ["train.steps=20", "train.rate=1e-3", "train.tb=true", "model.sizes=[1, 2]",
                                 "data.path=runs/x", 'data.name="quoted"', "a.b.c=3"])
    assert out == {"train": {"steps": 20, "rate": 0.001, "tb": True}, "model": {"sizes": [1, 2]},
                   "data": {"path": "runs/x", "name": "quoted"}, "a": {"b": {"c": 3}}}
    assert data == {"train": {"steps": 1}}  # the file's tables are not changed in place


def test_malformed_override_says_the_expected_form():
    for bad in ("steps=3", "train.steps"):
        with pytest.raises(ConfigError) as err:
            apply_overrides({}, [bad])
        assert str(err.value) == f"override {bad!r}: expected section.key=value, e.g. model.d_model=64"


def test_override_through_a_value_is_refused():
    with pytest.raises(ConfigError) as err:
        apply_overrides({"train": {"steps": 3}}, ["train.steps.x=1"])
    assert str(err.value) == "override 'train.steps.x=1': 'steps' is not a section"


def test_split_overrides_separates_dotted_flags():
    overrides, rest = split_overrides(["--eval.shots=1,2", "--task", "sst2", "--out=a.b", "--config", "x.toml",
                                       "--eval.method.scoring=answer-mean"])
    assert overrides == ["eval.shots=1,2", "eval.method.scoring=answer-mean"]
    assert rest == ["--task", "sst2", "--out=a.b", "--config", "x.toml"]
