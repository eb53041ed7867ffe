#!/usr/bin/env bash
# Fill .wheels/ (ignored; the `run` tool carries it to the device) with the wheels of
# scripts/device_wheels.txt for CPython 3.11-3.14 on x86-64 Linux: a pure-Python wheel once, a
# compiled one per version (pydantic_core, orjson, zstandard), so the device run installs offline
# on whatever Python the machine has. About 33 MiB; the carry limit is 64 MiB with the tree.
#     bash scripts/device_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .wheels
mapfile -t reqs < <(sed 's/#.*//; s/[[:space:]]*$//' scripts/device_wheels.txt | grep -v '^$')
for version in 3.11 3.12 3.13 3.14; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .wheels "${reqs[@]}"
done
du -sh .wheels
