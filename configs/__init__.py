"""The run files shipped with the package (TOML data, no code): `evalm run`'s embedded default and
the tiny and paper-scale training, tuning and evaluation configs. `config_toolkit.shipped` finds
them from any working directory, so `configs/NAME.toml` works outside a checkout too."""
