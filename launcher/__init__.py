"""The `evalm` command and `evalm run`, in rooms (read top-down; no module imports one above it):

    commands.py   the package commands (`data`, `train`, `eval`, `export`), each imported lazily
    cli.py        `evalm`: `run` plus the command table; --version, --debug
    run_file.py   the run file of `evalm run`: its sections, validated; the models a run trains
    runner.py     the one runner of run files: units (stages, study steps), their keys and what is done
    stages.py     the stage table: each stage's steps (argv + the steps it reads from), from the command table
    keys.py       a stage's key inputs: the settings files and sample folders its commands read
    markers.py    the main job's stage marker; a stage folder deleted only when this run made it
    console.py    the quiet console: a stage's output to its log, progress bars on screen
    report.py     the report folder (results.json, plots); summary.py its summary.md
    schedule.py   the steps one at a time in this process, `jobs` child processes at once, or teed in turn
    study_file.py a study's run file: [study], its vars, its [[step]]s, validated
    study.py      a study's steps as the runner's units, in its own run folder
    run.py        `evalm run`: the run file read once; the main job's stages (a [study] file: study.py)

Beside them, the GPU run's two ends: device_run.py (the run on a bare GPU machine, standard library
only) and gpu_tables.py (docs/results.md's GPU tables from its committed evidence).
"""
