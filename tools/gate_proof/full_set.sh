#!/usr/bin/env bash
# The gate on the whole default speed set, as users run it: SAVES runs that save (pool) baselines,
# then CLEAN runs that only gate. Counts the regressions each clean run reports (expected: none).
# Usage: tools/gate_proof/full_set.sh OUT BASELINE_DIR SAVES CLEAN
# BASELINE_DIR is used in place (copy the committed baselines there first to start from them);
# OUT gets full-set.summary.txt, full-set.log (every gate table) and the baseline file at the end.
set -uo pipefail
out=${1:?usage: full_set.sh OUT BASELINE_DIR SAVES CLEAN}
bl=${2:?baseline dir}; saves=${3:?saves}; clean=${4:?clean runs}
mkdir -p "$out" "$bl"
bash "$(dirname "$0")/../install_offline.sh" "$out" || exit 1
args=(--attnkit --attnkit-suite speed "--attnkit-baseline-dir=$bl" -p no:cacheprovider --benchmark-disable -q)
log="$out/full-set.log"; summary="$out/full-set.summary.txt"
{ echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"; nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader | sed 's/^/device: /'
  echo "host: $(hostname)"; echo "command: pytest ${args[*]} [--attnkit-save-baseline]"; } | tee -a "$summary" >>"$log"
run() {  # label [extra pytest args]
  local label=$1 text status start; shift
  start=$(date +%s)
  text=$(PYTHONUNBUFFERED=1 pytest "${args[@]}" "$@" 2>&1); status=$?
  { echo "=== $label: exit $status, $(( $(date +%s) - start )) s"
    echo "$text" | sed -n '/^first calls/p;/^gate/,/^===/p;/^baseline saved/p' | grep -v '^===='
    echo "$text" | tail -n 1; } >>"$log"
  printf '%-8s exit=%s wall=%ss regressions=%s improvements=%s gated=%s %s\n' "$label" "$status" "$(( $(date +%s) - start ))" \
    "$(echo "$text" | grep -cE ' REGRESSION' || true)" "$(echo "$text" | grep -cE ' improvement$' || true)" \
    "$(echo "$text" | grep -cE ' (unchanged|improvement|REGRESSION|insufficient)( \(|$)' || true)" \
    "$(echo "$text" | grep -E '^baseline saved' | sed 's/.*json //')" | tee -a "$summary"
  cp "$bl"/*.json "$out/" 2>/dev/null  # after every run: a call cut short keeps what it saved
}
for i in $(seq 1 "$saves"); do run "save-$i" --attnkit-save-baseline; done
for i in $(seq 1 "$clean"); do run "clean-$i"; done
exit 0
