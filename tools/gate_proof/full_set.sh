#!/usr/bin/env bash
# The gate on the whole default speed set, as users run it: runs labelled save-N save (pool) this
# GPU's baselines, runs labelled anything else only gate. Counts the regressions each run reports
# (expected after the saves: none). Split a long proof over several device calls by passing the
# same BASELINE_DIR and the next labels.
# Usage: tools/gate_proof/full_set.sh OUT BASELINE_DIR LABEL... (for example: save-1 save-2 clean-1)
# BASELINE_DIR is used in place (copy the committed baselines there first to start from them);
# OUT gets full-set.summary.txt (a line per run), full-set.log (every gate table and the slowest
# tests) and the baseline file after every run, so a call cut short keeps what it saved.
# With DEADLINE_S set, a run is started only if the longest run so far still fits before that many
# seconds from the script's start (a device call has a hard limit; a run killed halfway says nothing).
set -uo pipefail
out=${1:?usage: full_set.sh OUT BASELINE_DIR LABEL...}
bl=${2:?usage: full_set.sh OUT BASELINE_DIR LABEL...}
shift 2
mkdir -p "$out" "$bl"
bash "$(dirname "$0")/../install_offline.sh" || exit 1
args=(--attnkit --attnkit-suite speed "--attnkit-baseline-dir=$bl" -p no:cacheprovider --benchmark-disable -q --durations=8)
log="$out/full-set.log"; summary="$out/full-set.summary.txt"
{ echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"; nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader | sed 's/^/device: /'
  echo "host: $(hostname)"; echo "command: pytest ${args[*]} [--attnkit-save-baseline]"; } | tee -a "$summary" >>"$log"
began=$(date +%s); longest=0
for label in "$@"; do
  if [ -n "${DEADLINE_S:-}" ] && [ $(( $(date +%s) - began + longest )) -gt "$DEADLINE_S" ]; then
    echo "not started: $label and the rest (the longest run, ${longest} s, would end after ${DEADLINE_S} s)" | tee -a "$summary"
    break
  fi
  extra=(); [[ $label == save* ]] && extra=(--attnkit-save-baseline)
  start=$(date +%s)
  text=$(PYTHONUNBUFFERED=1 pytest "${args[@]}" "${extra[@]}" 2>&1); status=$?
  { echo "=== $label: exit $status, $(( $(date +%s) - start )) s"
    echo "$text" | sed -n '/^first calls/p;/^ceilings/p;/^gate/,/^===/p;/^baseline saved/p' | grep -v '^===='
    echo "$text" | grep -E '^[0-9.]+s (call|setup) '
    echo "$text" | tail -n 1; } >>"$log"
  gate=$(echo "$text" | sed -n '/^gate against/,/^====/p')  # the gate's table: one row per entry
  printf '%-8s exit=%s wall=%ss regressions=%s improvements=%s gated=%s %s\n' "$label" "$status" "$(( $(date +%s) - start ))" \
    "$(echo "$gate" | grep -cE ' REGRESSION( \(|$)' || true)" "$(echo "$gate" | grep -cE ' improvement( \(|$)' || true)" \
    "$(echo "$gate" | grep -cE ' (unchanged|improvement|REGRESSION|insufficient)( \(|$)' || true)" \
    "$(echo "$text" | grep -E '^baseline saved' | sed 's/.*json //')" | tee -a "$summary"
  cp "$bl"/*.json "$out/" 2>/dev/null
  took=$(( $(date +%s) - start )); [ "$took" -gt "$longest" ] && longest=$took
done
exit 0
