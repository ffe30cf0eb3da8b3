#!/usr/bin/env bash
# The proof of --attnkit-against (issue 20) on a GPU: the same-run A/B gate holds still on a clean
# tree and catches a real 5% and 3% slowdown of triton_flash, next to the stored-baseline gate on
# the same runs, and an A/B run's wall time against a plain speed run of the same selection.
#
# Usage: tools/against_proof/run.sh OUT [GROUP...], a GROUP being NAME:EXTRA:RUNS[:SECONDS], default
#   clean:0:1 plain:0:1 clean:0:4 slower5:0.05:10 slower3:0.03:10
# - EXTRA 0: HEAD against HEAD on the clean selection (IMPLS, CLEAN_K: the default speed set);
# - EXTRA > 0: a commit whose triton_flash forward also runs extra work, calibrated on the GPU to
#   that share of the kernel's time, against its parent, on SLOW_IMPLS and SLOW_K (four forward
#   non-causal cases, those of tools/gate_proof/run.sh);
# - a NAME starting with "plain": the clean selection without --attnkit-against; the wall-time
#   ratio compares it with the clean runs, leaving out the first run of the call (cold caches).
# The tree this script lives in is copied into a scratch git repository (git init, commit "base",
# then "slow" on it) that is installed editable into python3 for the runs (pip -e, no deps, no
# build isolation); this tree is installed editable again at the end. Nothing else is changed.
#
# Environment: IMPLS (torch_sdpa,triton_flash), SLOW_IMPLS (triton_flash), CLEAN_K (none),
#   SLOW_K (the four cases), THRESHOLD (empty: each gate's default, the A/B gate's 2% and
#   the stored gate's 8%; a value: --attnkit-threshold, the stored gate's), DEADLINE_S (a run starts only if it is expected to end within that
#   many seconds of the start: expected, 1.1 x the longest run of its group so far but the group's
#   first, which calibrates or finds caches cold; before any, the group's SECONDS, else the longest
#   run so far of any group), PYTHON (python3), SCRATCH (the folder for the scratch repository and
#   the reports; default a new temporary one), KEEP_SCRATCH=1, PLOTS=1 (draw the report's plots,
#   which every run skips otherwise).
# OUT gets against-proof.summary.txt (device, commands, a line per run, totals, the wall-time
# ratio), against-proof.log (the same lines and every run's whole output) and calibration.jsonl
# (the extra work chosen per shape and share; a file already there is reused, so a call can bring
# an earlier call's). Every line is written as it happens: a call killed halfway keeps its runs.
set -uo pipefail
out=${1:?usage: tools/against_proof/run.sh OUT [NAME:EXTRA:RUNS...]}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
exec "${PYTHON:-python3}" "$here/against_proof.py" "$@"
