#!/usr/bin/env bash
# The gate's proof on a GPU, on four forward cases: save fresh baselines (two runs, pooled, as the
# README advises), then 5 clean runs, 10 runs 10% slower and 10 runs 25% slower, counting the
# regressions the gate reports. Every run times slowable_flash (tools/gate_proof/site): triton_flash
# and a companion launch of the same program; the slower runs give the companion more work,
# calibrated on the GPU to that share of the clean call's time by the first run that needs it and
# reused by the rest, so all ten runs time one implementation (calibration.jsonl shows it).
# Usage: tools/gate_proof/run.sh OUT [GROUP...], a GROUP being NAME:EXTRA:RUNS (default: clean:0:5
# slower10:0.10:10 slower25:0.25:10). With DEADLINE_S set, a run starts only while the longest run
# so far still ends within that many seconds of the start.
# OUT gets gate-proof.summary.txt (a line per run and the totals), gate-proof.log (every gate
# table and the saves' output), calibration.jsonl and the baseline file. To split a proof over
# device calls (each has a time limit), set BASELINE_DIR: the saves run only when it holds no
# baseline yet, so a later call can bring the first call's file and run the other groups.
set -uo pipefail
out=${1:?usage: tools/gate_proof/run.sh OUTPUT_DIR [GROUP...]}
shift
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
bash "$here/../install_offline.sh" || exit 1
export PYTHONPATH="$here/site${PYTHONPATH:+:$PYTHONPATH}"
export ATTNKIT_EXTRA_WORK_LOG="$out/calibration.jsonl"
bl=${BASELINE_DIR:-$(mktemp -d)}
mkdir -p "$bl"
cases='test_speed_forward and not causal and (q1024-k1024-d128 or q4096-k4096-d128 or q16384-k16384-d128 or q4096-k4096-d64)'
# One request at a time: the first call of a shape calibrates its extra work, and that call is the
# case's warm-up, which otherwise runs beside the other cases' warm-ups. Calibrated beside them on
# an H100 (2026-11-26), a 16k call measured 8.3 ms against 3.3 ms alone and the slowdowns came out
# anywhere from -58% to +293%.
args=(--attnkit --attnkit-suite speed --attnkit-impl torch_sdpa,slowable_flash -k "$cases" --attnkit-jobs=1
      "--attnkit-baseline-dir=$bl" -p no:cacheprovider --benchmark-disable -q)
log="$out/gate-proof.log"; summary="$out/gate-proof.summary.txt"
{ echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version,serial --format=csv,noheader | sed 's/^/device: /'
  echo "command: pytest ${args[*]} [--attnkit-save-baseline]"; } | tee "$log" >"$summary"
run() {  # label extra [pytest args]
  local label=$1 extra=$2 text status table cases_flagged change
  shift 2
  text=$(ATTNKIT_EXTRA_WORK=$extra pytest "${args[@]}" "$@" 2>&1); status=$?
  { echo "=== $label (ATTNKIT_EXTRA_WORK=$extra) exit $status"
    echo "$text" | sed -n '/^gate against/,/^===/p;/^baseline saved/p' | grep -v '^===='
    echo "$text" | tail -n 1; } >>"$log"
  # The gate's rows: a line naming the case, then one with its figures ("base ms ... change +9.5%
  # ... verdict REGRESSION 3/3").
  table=$(echo "$text" | sed -n '/^gate against/,$p' | grep -A1 -E '^slowable_flash +fwd ' | grep -E '^ +base ms')
  cases_flagged=$(echo "$table" | grep -c 'REGRESSION' || true)
  change=$(echo "$table" | awk '{for (i = 1; i < NF; i++) if ($i == "change") printf "%s ", $(i + 1)}')
  printf '%-12s extra=%-5s exit=%s  slowable_flash cases flagged %s of %s  change after the machine factor: %s\n' \
    "$label" "$extra" "$status" "$cases_flagged" "$(echo "$table" | grep -c . || true)" "$change" | tee -a "$summary"
  last_flagged=$cases_flagged
}
start=$(date +%s); longest=0
timed_run() {  # like run, unless it could not end before DEADLINE_S; returns 1 then
  local began
  if [ -n "${DEADLINE_S:-}" ] && [ $(( $(date +%s) - start + longest )) -gt "$DEADLINE_S" ]; then
    echo "not started: $1 and the rest (the longest run, ${longest} s, would end after ${DEADLINE_S} s)" | tee -a "$summary"
    return 1
  fi
  began=$(date +%s); run "$@"; [ $(( $(date +%s) - began )) -gt "$longest" ] && longest=$(( $(date +%s) - began )); return 0
}
groups=("$@"); [ ${#groups[@]} -gt 0 ] || groups=(clean:0:5 slower10:0.10:10 slower25:0.25:10)
if ls "$bl"/*.json >/dev/null 2>&1; then
  echo "baselines: saved by an earlier call, $(ls "$bl"/*.json)" | tee -a "$summary"
else
  for i in 1 2; do timed_run "save-$i" 0 --attnkit-save-baseline || exit 1; done
fi
for group in "${groups[@]}"; do
  IFS=: read -r name extra count <<<"$group"
  runs=0; flagged=0; done_runs=0
  for i in $(seq 1 "$count"); do
    timed_run "$name-$i" "$extra" || break
    done_runs=$((done_runs + 1)); flagged=$((flagged + last_flagged)); [ "$last_flagged" -gt 0 ] && runs=$((runs + 1))
  done
  echo "total $name: runs reporting a regression $runs of $done_runs; cases flagged $flagged of $((4 * done_runs))" | tee -a "$summary"
done
echo "calibrated extra work (once per shape, reused by every later run; the slowdown measured then):" | tee -a "$summary"
touch "$out/calibration.jsonl"  # none on the CPU, where the extra work is not calibrated
python3 - "$out/calibration.jsonl" <<'EOF' | tee -a "$summary"
import json, sys
for line in open(sys.argv[1], encoding="utf-8"):
    e = json.loads(line)
    attempts = ", ".join(f"{a['rows']}x{a['keys']} {100 * a['measured_slowdown']:+.1f}%" for a in e["attempts"])
    print(f"  extra {e['extra']:.2f} q{e['q']} k{e['k']}: {e['rows']} of {e['of_rows']} rows against {e['keys']} of "
          f"{e['of_keys']} keys, base {e['kernel_ms']:.4f} ms, measured {100 * e['measured_slowdown']:+.1f}% "
          f"(attempts, rows x keys: {attempts})")
EOF
cp "$bl"/*.json "$out/" 2>/dev/null
echo "wall time: $(( $(date +%s) - start )) s" | tee -a "$summary"
