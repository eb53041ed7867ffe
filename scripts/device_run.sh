#!/usr/bin/env bash
# The device run on a bare GPU machine: the `run` tool's command (docs/results.md, "EVA on a GPU"
# gives the call, its carry list and timeout). Installs offline from .wheels/, then the CUDA tests,
# attention, training and the cache, each under its own timeout, the whole under 8 minutes; the
# evidence lands in /tmp/evalm-device-evidence/<date>-<commit>/ and, packed after every section, in
# $OUT/<date>-<commit>.tar.gz (the run tool brings back 8 files; launcher/device_run.py).
#     bash scripts/device_run.sh COMMIT          # COMMIT: the committed tree the run copies
#     bash scripts/device_run.sh COMMIT --dry-run  # the plan and its timeouts, anywhere
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/evalm-device-out}
work=/tmp/evalm-device-evidence
py=$(command -v python3 || command -v python)
commit=${1:-}
shift || true
exec timeout -k 10 480 "$py" launcher/device_run.py --out "$work" --pack "$out" --commit "$commit" --budget 470 "$@"
