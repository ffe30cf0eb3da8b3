#!/usr/bin/env bash
# GPU evidence: install offline, then `pytest --attnkit [extra args]`, and keep what it printed.
# Usage: tools/gpu_main_job.sh OUTPUT_DIR LABEL [pytest args...]
# Writes LABEL.log, LABEL.xml (JUnit) and LABEL.summary.txt (command, device, date, duration).
set -uo pipefail
out=${1:?usage: tools/gpu_main_job.sh OUTPUT_DIR LABEL [pytest args...]}
label=${2:?usage: tools/gpu_main_job.sh OUTPUT_DIR LABEL [pytest args...]}
shift 2
mkdir -p "$out"
bash "$(dirname "$0")/install_offline.sh" || exit 1
command=(pytest --attnkit -p no:cacheprovider -rs --durations=15 "--junitxml=$out/$label.xml" "$@")
summary="$out/$label.summary.txt"
{
  echo "command: ${command[*]}"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,serial --format=csv,noheader | sed 's/^/device: /'
} >"$summary"
start=$(date +%s)
PYTHONUNBUFFERED=1 "${command[@]}" 2>&1 | tee "$out/$label.log"
status=${PIPESTATUS[0]}
end=$(date +%s)
{
  echo "exit status: $status"
  echo "wall time: $((end - start)) s"
  tail -n 1 "$out/$label.log" | sed 's/^/result: /'
} >>"$summary"
cat "$summary"
exit "$status"
