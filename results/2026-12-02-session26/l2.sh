#!/usr/bin/env bash
# NOTES v37's next, first look: -dqb and -rot-dqb at 4k d128 full under ncu at the GPU's own clock, L2 reduce sectors per slice (max/avg/min)
set -uo pipefail
bash tools/install_offline.sh > /tmp/install.log 2>&1 || { tail -20 /tmp/install.log; exit 1; }
M=lts__t_sectors_op_red.sum,lts__t_sectors_op_red.max,lts__t_sectors_op_red.avg,lts__t_sectors_op_red.min,lts__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum
mkdir -p $OUT/l2; { nvidia-smi --query-gpu=name,serial --format=csv,noheader; date -u; git log --oneline -1; } > $OUT/l2/device.txt
for C in tmar-dqb rot-tmar-dqb tmar-sw; do N=$C-4k-full-none
  timeout 70 ncu --clock-control none --target-processes all --nvtx --nvtx-include "profiled/" -k regex:_attn_bwd_sm90 --section SpeedOfLight --section WarpStateStats --metrics $M python3 tools/flash_bench/ncu_case.py bwd-bf16-d128-4k-m64s2-$C-ld-lt-rl-dqp --by gluon > $OUT/l2/$N.txt 2>&1; echo "$N rc $?"
  grep -E "lts__t_sectors_op_red|lts__throughput|hmma|shared_op_ld|Duration|SM Frequency|Elapsed Cycles|Warp Cycles Per Issued" $OUT/l2/$N.txt; done
