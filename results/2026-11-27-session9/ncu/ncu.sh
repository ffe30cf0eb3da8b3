#!/usr/bin/env bash
# usage: bash _lab/ncu.sh  (device machine): ncu of the FP8 forward, Gluon and Triton, and bf16 Gluon
set -uo pipefail
M=sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,dram__bytes_read.sum,smsp__inst_executed.sum
prof() { # label env case
  echo "== $1 ($2 $3)"; local s=$(date +%s)
  env $2 timeout 150 ncu --target-processes all -k regex:attn_fwd --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \
    --metrics $M python3 tools/flash_bench/ncu_case.py $3 > $OUT/ncu-$1.txt 2>&1; echo "rc $? $(( $(date +%s)-s )) s"
  grep -E "attn_fwd|Duration|SM Throughput|Compute \(SM\)|gmma|Registers Per|Achieved Occupancy|issue_active|Stall|Shared Memory Configuration Size|Dynamic Shared" $OUT/ncu-$1.txt | head -16
}
prof fp8g-d128-4k ATTNKIT_TRITON_FLASH_GLUON_FP8=1 fp8-d128-4k
prof fp8t-d128-4k ATTNKIT_TRITON_FLASH_GLUON_FP8=0 fp8-d128-4k
prof bf16g-d128-4k X=1 bf16-d128-4k
prof fp8g-d64-4k ATTNKIT_TRITON_FLASH_GLUON_FP8=1 fp8-d64-4k
prof fp8t-d64-4k ATTNKIT_TRITON_FLASH_GLUON_FP8=0 fp8-d64-4k
