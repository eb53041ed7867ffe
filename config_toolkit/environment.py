"""The environment a command starts with: set once, by the command line, never by an import.

Nothing may reach a model or dataset hub at run time (without these, a hub lookup hangs ~23 s
before failing), so every entry point (`evalm`, `python -m evalm.icl_eval`, `python -m
evalm.train.pretrain|msit`) starts with `command_environment()`: `HF_HUB_OFFLINE=1` and
`HF_DATASETS_OFFLINE=1` unless the user set them. One policy everywhere: a user's explicit setting
wins. Importing a module of ours changes nothing in the process (a library user's own settings
stay theirs), and `hub_offline` lets the code that opens `datasets` follow the same rule.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

DEFAULTS = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
"""Variable -> its value when the user has not set it."""

_FALSE = {"0", "false", "no", "off"}


def command_environment(env: MutableMapping[str, str] = os.environ) -> None:
    """Each default of `DEFAULTS` that the user has not set; what they set is left as it is."""
    for name, value in DEFAULTS.items():
        env.setdefault(name, value)


def hub_offline(env: MutableMapping[str, str] = os.environ) -> bool:
    """Whether hub access is off: yes unless the user switched it on (`HF_HUB_OFFLINE=0`)."""
    return env.get("HF_HUB_OFFLINE", DEFAULTS["HF_HUB_OFFLINE"]).strip().lower() not in _FALSE
