"""The `evalm` command and `evalm run`, in rooms (read top-down; no module imports one above it):

    commands.py   the package commands (`data`, `train`, `eval`, `export`), each imported lazily
    cli.py        `evalm`: `run` plus the command table; --version, --debug
    run_file.py   the run file of `evalm run`: its sections, validated; the models a run trains
    stages.py     the stage table: each stage's steps (argv + the steps it reads from), from the command table
    keys.py       stage keys: commands, the files and sample folders they read, the previous key
    markers.py    stage markers, stale marks, peak memory
    console.py    the quiet console: a stage's output to its log, progress bars on screen
    report.py     the report folder (results.json, plots); summary.py its summary.md
    schedule.py   the steps one at a time in this process, or `jobs` child processes at once
    run.py        `evalm run`: every stage, skip by key, --from, --only

Beside them, the GPU run's two ends: device_run.py (the run on a bare GPU machine, standard library
only) and gpu_tables.py (docs/results.md's GPU tables from its committed evidence).
"""
