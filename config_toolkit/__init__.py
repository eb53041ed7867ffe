"""The configuration toolkit every package uses, on the ground floor (it imports nothing of ours).

Configs are data: TOML files read by `read_toml`, each section validated into a frozen pydantic
dataclass by `build` (unknown keys named with the valid ones, before pydantic; unknown sections by
`check_sections`, the same rule in every command), `section.key=value`
overrides, the user-error types (`UserError` and its `ConfigError`, `InputError`, `MissingInput`,
`MissingExtra`) with the one rule that tells them from bugs (`report`), an argparse `Parser` whose
errors are one line, the subcommand `Dispatcher` of every `evalm` command group, and the optional
libraries (`transformers_module`, `require_gguf`) imported with the one-line error naming their extra.
"""

from evalm.config_toolkit.dispatch import Dispatcher, lazy
from evalm.config_toolkit.errors import (ConfigError, InputError, MissingExtra, MissingInput, UserError, debug,
                                         is_user_error, note_folder, report)
from evalm.config_toolkit.extras import require_gguf, transformers_module
from evalm.config_toolkit.files import read_toml
from evalm.config_toolkit.keys import settable_keys
from evalm.config_toolkit.overrides import apply_overrides, split_overrides
from evalm.config_toolkit.parser import Parser
from evalm.config_toolkit.schema import FROZEN, build, check_overrides, check_sections, to_dict
from evalm.config_toolkit.shipped import shipped
from evalm.config_toolkit.toml_text import parse_toml

__all__ = [
    "FROZEN", "ConfigError", "Dispatcher", "InputError", "MissingExtra", "MissingInput", "Parser", "UserError",
    "apply_overrides", "build", "check_overrides", "check_sections", "debug", "is_user_error", "lazy", "note_folder", "parse_toml",
    "read_toml", "report", "require_gguf", "settable_keys", "shipped", "split_overrides", "to_dict",
    "transformers_module",
]
