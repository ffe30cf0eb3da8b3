#!/usr/bin/env bash
# Installs this checkout on the GPU machine, which has no network (../shared/MACHINES.md):
# editable, with the build backend and dependencies already there. Usage: tools/install_offline.sh
# pip's log is printed only if the install fails: a device call brings back at most 8 files, and a
# proof that chains several scripts should spend them on results.
set -uo pipefail
log=$(mktemp)
python3 -m pip install --quiet --no-build-isolation --no-deps -e . >"$log" 2>&1 || { cat "$log"; exit 1; }
