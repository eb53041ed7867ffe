"""The `evalm` command: one dict of subcommands, each importing its package lazily."""
