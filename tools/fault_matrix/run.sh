#!/usr/bin/env bash
# The GPU part of the fault matrix: the broken implementations of fault_kernels.py beside
# torch_sdpa and triton_flash, through correctness and speed, on one small and one large case.
# Usage: tools/fault_matrix/run.sh OUTPUT_DIR
set -uo pipefail
out=${1:?usage: tools/fault_matrix/run.sh OUTPUT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
bash "$(dirname "$0")/../install_offline.sh" || exit 1
export PYTHONPATH="$here/site${PYTHONPATH:+:$PYTHONPATH}"
select='(test_forward and b2-h4-q113-k113-d64-fp16 and not causal) or (test_speed_forward and b4-h16-q4096-k4096-d128-bf16 and not causal)'
{ echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/device: /'; } >"$out/fault-matrix.log"
command=(pytest --attnkit --attnkit-suite correctness,speed --attnkit-impl 'torch_sdpa,triton_flash,fault_*'
         -k "$select" "--attnkit-baseline-dir=$(mktemp -d)" --attnkit-timeout 120 -p no:cacheprovider
         --benchmark-disable -rA --tb=line)
echo "command: ${command[*]}" >>"$out/fault-matrix.log"
PYTHONUNBUFFERED=1 "${command[@]}" 2>&1 | tee -a "$out/fault-matrix.log"
echo "exit status: ${PIPESTATUS[0]}" | tee -a "$out/fault-matrix.log"
