#!/usr/bin/env bash
# Installs this checkout on the GPU machine, which has no network (../shared/MACHINES.md):
# editable, with the build backend and dependencies already there. Usage: tools/install_offline.sh OUT
# (the pip log goes to OUT/install.log and is printed if the install fails).
set -uo pipefail
out=${1:?usage: tools/install_offline.sh OUTPUT_DIR}
mkdir -p "$out"
python3 -m pip install --quiet --no-build-isolation --no-deps -e . >"$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
