#!/usr/bin/env bash
# GPU evidence for the main job: install offline, then `pytest --attnkit` (every suite, default set).
# Writes the log, a JUnit XML file and a summary (command, device, date, duration) to $1.
set -uo pipefail
out=${1:?usage: tools/gpu_main_job.sh OUTPUT_DIR}
mkdir -p "$out"
python3 -m pip install --quiet --no-build-isolation --no-deps -e . >"$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
command="pytest --attnkit -p no:cacheprovider -rs --durations=15 --junitxml=$out/attnkit-default.xml"
{
  echo "command: $command"
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | sed 's/^/device: /'
} >"$out/summary.txt"
start=$(date +%s)
PYTHONUNBUFFERED=1 $command 2>&1 | tee "$out/attnkit-default.log"
status=${PIPESTATUS[0]}
end=$(date +%s)
{
  echo "exit status: $status"
  echo "wall time: $((end - start)) s"
  tail -n 1 "$out/attnkit-default.log" | sed 's/^/result: /'
} >>"$out/summary.txt"
cat "$out/summary.txt"
exit "$status"
