#!/usr/bin/env bash
# The gate's proof on a GPU: save fresh baselines, then 5 clean runs, 10 runs with 10% extra work
# and 10 with 25%, counting the regressions the gate reports. Usage: tools/gate_proof/run.sh OUT
set -uo pipefail
out=${1:?usage: tools/gate_proof/run.sh OUTPUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
bash "$(dirname "$0")/../install_offline.sh" "$out" || exit 1
export PYTHONPATH="$here/site${PYTHONPATH:+:$PYTHONPATH}"
bl=$(mktemp -d)
cases='test_speed_forward and not causal and (q1024-k1024-d128 or q4096-k4096-d128 or q16384-k16384-d128 or q4096-k4096-d64)'
args=(--attnkit --attnkit-suite speed --attnkit-impl torch_sdpa,slowable_flash -k "$cases"
      "--attnkit-baseline-dir=$bl" -p no:cacheprovider --benchmark-disable -q)
log="$out/gate-proof.log"
{ echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/device: /'
  echo "command: pytest ${args[*]}"; } | tee "$log"
run() {  # label extra
  local label=$1 extra=$2 text status
  text=$(ATTNKIT_EXTRA_WORK=$extra pytest "${args[@]}" "${@:3}" 2>&1); status=$?
  echo "=== $label (ATTNKIT_EXTRA_WORK=$extra) exit $status" >>"$log"
  echo "$text" | sed -n '/^gate against/,/^===/p' | grep -v '^===' >>"$log"
  echo "$text" | tail -n 1 >>"$log"
  local regressions; regressions=$(echo "$text" | grep -c 'slowable_flash .* REGRESSION' || true)
  printf '%-14s extra=%-5s exit=%s slowable_flash cases flagged: %s of 4\n' "$label" "$extra" "$status" "$regressions" | tee -a "$out/gate-proof.summary.txt"
}
start=$(date +%s)
ATTNKIT_EXTRA_WORK=0 pytest "${args[@]}" --attnkit-save-baseline >"$out/save.log" 2>&1
echo "baseline saved: exit $?" | tee -a "$out/gate-proof.summary.txt"
for i in 1 2 3 4 5; do run "clean-$i" 0; done
for i in $(seq 1 10); do run "slower10-$i" 0.10; done
for i in $(seq 1 10); do run "slower25-$i" 0.25; done
echo "wall time: $(( $(date +%s) - start )) s" | tee -a "$out/gate-proof.summary.txt"
