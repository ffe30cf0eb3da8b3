#!/usr/bin/env bash
# usage: bash _lab/dev.sh STEP [LABEL] [STEP [LABEL]...]  (device machine)
set -uo pipefail
M=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__throughput.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,lts__t_sectors_op_red.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,launch__registers_per_thread,launch__grid_size,launch__block_size,launch__shared_mem_per_block_dynamic,sm__warps_active.avg.pct_of_peak_sustained_active
IMPLS="--attnkit-impl=torch_sdpa,triton_flash,cupy_naive,torch_flex"
mj() { python3 tools/main_job_time.py run /tmp/r "$@"; }
pack() { tar czf "$OUT/$1.tgz" -C /tmp/r "$1"; }
while [ $# -gt 0 ]; do
  step=$1; shift
  case $step in
    install)
      bash tools/install_offline.sh > /tmp/install.log 2>&1 || { tail -30 /tmp/install.log; exit 1; }
      mkdir -p /tmp/bl && [ -e /tmp/bl/.seeded ] || { cp baselines/nvidia*.json /tmp/bl/; touch /tmp/bl/.seeded; }
      nvidia-smi --query-gpu=name,driver_version,memory.total,serial,clocks.sm,clocks.max.sm --format=csv
      date -u; git log --oneline -1 2>/dev/null ;;
    cold) L=$1; shift; mj "$L" --cold --cache /tmp/ac --timeout 580 -- $IMPLS --attnkit-baseline-dir=/tmp/bl --attnkit-require-baseline; pack "$L" ;;
    warm) L=$1; shift; mj "$L" --cache /tmp/ac --timeout 580 -- $IMPLS --attnkit-baseline-dir=/tmp/bl --attnkit-require-baseline; pack "$L" ;;
    save) L=$1; shift; mj "$L" --cache /tmp/ac --timeout 580 -- $IMPLS --attnkit-baseline-dir=/tmp/bl --attnkit-suite=speed --attnkit-save-baseline; pack "$L"; cp /tmp/bl/nvidia*.json "$OUT/" ;;
    sanitize) L=$1; shift; mkdir -p /tmp/r/$L
      { date -u; nvidia-smi --query-gpu=name,serial --format=csv,noheader; git log --oneline -1;
        echo "+ pytest --attnkit --attnkit-suite=sanitize $IMPLS --attnkit-cache-dir=/tmp/ac -p no:cacheprovider -rs -q --attnkit-report=/tmp/r/$L/report"
        s=$(date +%s.%N)
        timeout 220 python3 -m pytest --attnkit --attnkit-suite=sanitize $IMPLS --attnkit-cache-dir=/tmp/ac -p no:cacheprovider -rs -q --attnkit-report=/tmp/r/$L/report; echo "exit $?"
        echo "wall $(python3 -c "import time;print(round(time.time()-$s,1))") s"
        echo "+ pytest tests/suites/test_sanitize.py -k on_the_gpu -rs -q -p no:cacheprovider"
        s=$(date +%s.%N)
        timeout 120 python3 -m pytest tests/suites/test_sanitize.py -k on_the_gpu -rs -q -p no:cacheprovider; echo "exit $?"
        echo "wall $(python3 -c "import time;print(round(time.time()-$s,1))") s"
      } > /tmp/r/$L/sanitize.log 2>&1; tail -25 /tmp/r/$L/sanitize.log; pack "$L" ;;
    fp8) L=$1; shift; ATTNKIT_TRITON_FLASH_GLUON_FP8=1 mj "$L" --cache /tmp/ac --timeout 580 -- --attnkit-impl=torch_sdpa,triton_flash --attnkit-suite=correctness,speed --attnkit-baseline-dir=/tmp/bl -k e4m3; pack "$L" ;;
    fp8pair) # the speed suite's e4m3 cases, Triton FP8 then Gluon FP8 (fp8_config's per-case tiles), same machine
      for L in fp8-triton fp8-gluon fp8-default; do
        case $L in fp8-triton) export ATTNKIT_TRITON_FLASH_GLUON_FP8=0;; fp8-gluon) export ATTNKIT_TRITON_FLASH_GLUON_FP8=1;; *) unset ATTNKIT_TRITON_FLASH_GLUON_FP8;; esac
        mj "$L" --cache /tmp/ac --timeout 200 -- --attnkit-impl=torch_sdpa,triton_flash --attnkit-suite=correctness,speed --attnkit-baseline-dir=/tmp/bl -k e4m3 | grep -E "exit status|wall time|outcomes|timeline|workers ready" 
        grep -E "e4m3" /tmp/r/$L/pytest.log | grep -E "^(triton_flash|torch_sdpa) +fwd|FAILED" | head -12; pack "$L"
      done ;;
    fp8check) timeout 300 python3 tools/flash_bench/fp8_check.py --out $OUT/fp8check > $OUT/fp8check.log 2>&1; echo "fp8check rc $?"; tail -30 $OUT/fp8check.log ;;
    bwdcheck) timeout 300 python3 tools/flash_bench/gluon_bwd_check.py --out $OUT/bwdcheck --variants m64s3-tmar-sw-dsr --case-timeout 60 > $OUT/bwdcheck.log 2>&1; echo "bwdcheck rc $?"; tail -30 $OUT/bwdcheck.log ;;
    sprof) for i in torch_sdpa triton_flash torch_flex cupy_naive; do timeout 150 python3 tools/speed_request_profile.py --impl $i --top 30 > $OUT/sprof-$i.txt 2>&1; echo "$i rc $?"; grep -A10 "by phase" $OUT/sprof-$i.txt; done ;;
    savefp8) L=$1; shift; mkdir -p /tmp/r/$L; timeout 200 python3 -m pytest --attnkit --attnkit-impl=torch_sdpa,triton_flash --attnkit-suite=speed -k e4m3 --attnkit-cache-dir=/tmp/ac --attnkit-baseline-dir=/tmp/bl --attnkit-save-baseline -p no:cacheprovider -rs -q --attnkit-report=/tmp/r/$L > /tmp/r/$L/pytest.log 2>&1; echo "savefp8 $L rc $?"; grep -E "gate|e4m3|passed|failed|Gluon" /tmp/r/$L/pytest.log | head -12; pack "$L"; cp /tmp/bl/nvidia*.json "$OUT/" ;;
    fp8gate) L=$1; shift; mkdir -p /tmp/r/$L; timeout 200 python3 -m pytest --attnkit --attnkit-impl=torch_sdpa,triton_flash --attnkit-suite=speed -k e4m3 --attnkit-cache-dir=/tmp/ac --attnkit-baseline-dir=/tmp/bl --attnkit-require-baseline -p no:cacheprovider -rs -q --attnkit-report=/tmp/r/$L > /tmp/r/$L/pytest.log 2>&1; echo "fp8gate $L rc $?"; grep -E "gate|e4m3|passed|failed|FP8" /tmp/r/$L/pytest.log | head -24; pack "$L" ;;
    sprof1) I=$1; N=$2; shift 2; timeout 200 python3 tools/speed_request_profile.py --impl $I --limit $N --top 40 > $OUT/sprof-$I.txt 2>&1; echo "$I rc $?"; grep -B2 -A12 "by phase" $OUT/sprof-$I.txt ;;
    gluoncheck) timeout 420 python3 tools/flash_bench/gluon_check.py --out $OUT/gluoncheck --variants n128s3-eager-sm,n128s2-eager-sm > $OUT/gluoncheck.log 2>&1; echo "gluoncheck rc $?"; tail -40 $OUT/gluoncheck/check.md ;;
    i42) # issue 42's GPU checks in one call (about 9 minutes at most)
      timeout 200 python3 tools/flash_bench/fp8_check.py --out $OUT/fp8check > $OUT/fp8check.log 2>&1; echo "fp8check rc $?"; tail -20 $OUT/fp8check.log
      timeout 150 python3 tools/flash_bench/gluon_bwd_check.py --out $OUT/bwdcheck --variants m64s3-tmar-sw-dsr --case-timeout 60 > $OUT/bwdcheck.log 2>&1; echo "bwdcheck rc $?"; tail -20 $OUT/bwdcheck.log
      timeout 180 python3 tools/flash_bench/gluon_check.py --out $OUT/gluoncheck --variants n128s3-eager-sm,n128s2-eager-sm > $OUT/gluoncheck.log 2>&1; echo "gluoncheck rc $?"; tail -25 $OUT/gluoncheck/check.md ;;
    ncubwd) # Nsight Compute: the d128 16k backward's third call through cuDNN, Triton and Gluon
      mkdir -p $OUT/ncu; nvidia-smi --query-gpu=name,serial,clocks.sm --format=csv,noheader > $OUT/ncu/device.txt; date -u >> $OUT/ncu/device.txt; git log --oneline -1 >> $OUT/ncu/device.txt
      for C in "bwd-bf16-d128-16k cudnn" "bwd-bf16-d128-16k triton" "bwd-bf16-d128-16k gluon" "bwd-bf16-d128-4k cudnn" "bwd-bf16-d128-4k gluon"; do
        read -r CS BY <<< "$C"; F=$OUT/ncu/$CS-$BY.txt
        echo "=== ncu $C" > $F
        timeout 150 ncu --target-processes all --nvtx --nvtx-include "profiled/" --section SpeedOfLight --section WarpStateStats --section Occupancy --section SchedulerStats --metrics $M python3 tools/flash_bench/ncu_case.py $CS --by $BY >> $F 2>&1; echo "$C rc $?"
        grep -E "^  [a-zA-Z_].*\(|Duration|hmma|issue_active|l1tex__throughput|lts__t_sectors_op_red|registers_per|Warp Cycles Per Issued|Achieved Occupancy|No Eligible" $F | head -40
      done ;;
    ncu1k) # Nsight Compute: the 1k d128 causal backward (b8-h16), Gluon's kernel and cuDNN's, every launch of the third call
      mkdir -p $OUT/ncu1k; nvidia-smi --query-gpu=name,serial,clocks.sm --format=csv,noheader > $OUT/ncu1k/device.txt; date -u >> $OUT/ncu1k/device.txt
      for BY in gluon cudnn triton; do F=$OUT/ncu1k/bwd-bf16-d128-1k-causal-$BY.txt; echo "=== ncu bwd-bf16-d128-1k --causal --by $BY" > $F
        if [ $BY = cudnn ]; then SEL="--launch-count 40"; else SEL='--nvtx --nvtx-include profiled/'; fi
        timeout 150 ncu --target-processes all $SEL --section SpeedOfLight --section WarpStateStats --section Occupancy --section SchedulerStats --section LaunchStats --metrics $M python3 tools/flash_bench/ncu_case.py bwd-bf16-d128-1k --causal --by $BY >> $F 2>&1; echo "$BY rc $?"
        grep -E "^  [a-zA-Z_].*\(|Duration|Grid Size|Waves Per SM|hmma|issue_active|Achieved Occupancy" $F | cut -c1-150 | head -30; done ;;
    ncucudnn) # cuDNN's fwd+bwd kernels, every launch (autograd runs the backward on its own thread: no NVTX range)
      mkdir -p $OUT/ncu; for CS in bwd-bf16-d128-16k bwd-bf16-d128-4k; do F=$OUT/ncu/$CS-cudnn.txt; echo "=== ncu $CS cudnn, every kernel" > $F
        timeout 200 ncu --target-processes all --launch-count 40 --section SpeedOfLight --section WarpStateStats --section Occupancy --section SchedulerStats --metrics $M python3 tools/flash_bench/ncu_case.py $CS --by cudnn >> $F 2>&1; echo "$CS rc $?"
        grep -E "^  [a-zA-Z_].*\(" $F | cut -c1-150 | sort | uniq -c | head -20; done ;;
    ncusrc) # per-SASS-instruction counters (shared stores, conflicts) of the Gluon and cuDNN backward at 4k d128
      mkdir -p $OUT/ncu
      timeout 200 ncu --target-processes all --nvtx --nvtx-include "profiled/" -k regex:_attn_bwd_sm90 --section SourceCounters --section InstructionStats --section MemoryWorkloadAnalysis_Tables -o /tmp/gluon4k -f python3 tools/flash_bench/ncu_case.py bwd-bf16-d128-4k --by gluon > $OUT/ncu/src-gluon.log 2>&1; echo "gluon rc $?"
      timeout 200 ncu --target-processes all -k regex:bprop --launch-skip 2 --launch-count 1 --section SourceCounters --section InstructionStats --section MemoryWorkloadAnalysis_Tables -o /tmp/cudnn4k -f python3 tools/flash_bench/ncu_case.py bwd-bf16-d128-4k --by cudnn > $OUT/ncu/src-cudnn.log 2>&1; echo "cudnn rc $?"
      for R in gluon4k cudnn4k; do ncu -i /tmp/$R.ncu-rep --page source --csv --print-source sass > /tmp/$R-sass.csv 2>&1; echo "$R sass rc $? $(wc -l < /tmp/$R-sass.csv) lines"; gzip -c /tmp/$R-sass.csv > $OUT/ncu/$R-sass.csv.gz
        ncu -i /tmp/$R.ncu-rep --page details > $OUT/ncu/$R-details.txt 2>&1; head -3 /tmp/$R-sass.csv | cut -c1-600; done ;;
    warmprobe) export CUDA_CACHE_PATH=/tmp/wp-cache; rm -rf /tmp/wp-cache
      echo "-- a fresh process, warm-ups first"; timeout 200 python3 _lab/warmprobe.py warm
      echo "-- another fresh process, no warm-up (the JIT cache filled)"; timeout 200 python3 _lab/warmprobe.py cold ;;
    sdpaonly) L=$1; shift; mj "$L" --cold --cache /tmp/ac --timeout 230 -- --attnkit-impl=torch_sdpa --attnkit-suite=correctness,speed --attnkit-baseline-dir=/tmp/bl; pack "$L" ;;
    pair) # issue 42: -pair (one dQ reduce a tile) checked and timed beside the default, then both profiled at 4k d128
      timeout 330 python3 tools/flash_bench/gluon_bwd_check.py --out $OUT/bwdcheck --variants m64s2-tmar-sw-pair,m64s3-tmar-sw-pair --case-timeout 60 > $OUT/bwdcheck.log 2>&1; echo "bwdcheck rc $?"; tail -45 $OUT/bwdcheck/check.md
      mkdir -p $OUT/ncu; nvidia-smi --query-gpu=name,serial --format=csv,noheader > $OUT/ncu/device.txt; date -u >> $OUT/ncu/device.txt
      for CS in bwd-bf16-d128-4k bwd-bf16-d128-4k-m64s2-tmar-sw-pair; do F=$OUT/ncu/$CS-gluon.txt; echo "=== ncu $CS gluon" > $F
        timeout 120 ncu --target-processes all --nvtx --nvtx-include "profiled/" --section SpeedOfLight --section WarpStateStats --metrics $M python3 tools/flash_bench/ncu_case.py $CS --by gluon >> $F 2>&1; echo "$CS rc $?"
        grep -E "Duration|hmma|issue_active|l1tex__throughput|lts__t_sectors_op_red|shared_op_st|shared_op_ld|registers_per|Warp Cycles Per Issued" $F | head -16; done ;;
    ncupair) # the backward kernel alone, default and -pair, 4k d128, causal and not
      mkdir -p $OUT/ncu; nvidia-smi --query-gpu=name,serial --format=csv,noheader > $OUT/ncu/device.txt; date -u >> $OUT/ncu/device.txt
      for C in "bwd-bf16-d128-4k" "bwd-bf16-d128-4k-m64s2-tmar-sw-pair" "bwd-bf16-d128-4k --causal" "bwd-bf16-d128-4k-m64s2-tmar-sw-pair --causal"; do
        F=$OUT/ncu/$(echo $C | tr -d ' ' | sed 's/--/-/').txt; echo "=== ncu $C gluon" > $F
        timeout 120 ncu --target-processes all --nvtx --nvtx-include "profiled/" -k regex:_attn_bwd_sm90 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --metrics $M python3 tools/flash_bench/ncu_case.py $C --by gluon >> $F 2>&1; echo "$C rc $?"
        grep -E "Duration|hmma|issue_active|l1tex__throughput|lts__t_sectors_op_red|shared_op_st|shared_op_ld|registers_per|Warp Cycles Per Issued|No Eligible" $F | head -16; done ;;
    alt) # issue 42: the check's default variants (two reduces and -pair, s2 and s3) timed in rotating rounds; only check.md/json come back
      L=${1:-bwdalt}; shift || true; mkdir -p /tmp/r/$L $OUT/$L; nvidia-smi --query-gpu=name,serial --format=csv,noheader > $OUT/$L/device.txt; date -u >> $OUT/$L/device.txt
      timeout 420 python3 tools/flash_bench/gluon_bwd_check.py --out /tmp/r/$L --case-timeout 60 > /tmp/r/$L/run.log 2>&1; echo "bwdcheck rc $?"
      cp /tmp/r/$L/check.md /tmp/r/$L/check.json $OUT/$L/ 2>/dev/null; tail -5 /tmp/r/$L/run.log > $OUT/$L/tail.txt; tail -50 /tmp/r/$L/check.md ;;
    mla) # issue 42: the Gluon forward's MLA (d192/dv128): the forward check (no variants), then the harness's d192 cases
      L=${1:-mla}; shift || true; mkdir -p /tmp/r/$L $OUT/$L; nvidia-smi --query-gpu=name,serial --format=csv,noheader > $OUT/$L/device.txt; date -u >> $OUT/$L/device.txt
      timeout 330 python3 tools/flash_bench/gluon_check.py --out /tmp/r/$L/check --variants "" --case-timeout 60 > /tmp/r/$L/check.log 2>&1; echo "gluon_check rc $?"
      cp /tmp/r/$L/check/check.md $OUT/$L/ 2>/dev/null; gzip -c /tmp/r/$L/check/check.json > $OUT/$L/check.json.gz 2>/dev/null; tail -3 /tmp/r/$L/check.log > $OUT/$L/check-tail.txt
      grep -E "FAIL|hung|ERROR" /tmp/r/$L/check.log | head -20; grep -E "d192|matmul" /tmp/r/$L/check.md | head -12
      mj "$L-harness" --cache /tmp/ac --timeout 240 -- --attnkit-impl=triton_flash,torch_sdpa,torch_flex --attnkit-suite=correctness,speed -k d192 --attnkit-baseline-dir=/tmp/bl | grep -E "exit status|wall time|outcomes"
      grep -E "^(triton_flash|torch_sdpa|torch_flex) +(fwd|bwd) .*d192|median|FAILED|forward:" /tmp/r/$L-harness/pytest.log | head -30; pack "$L-harness" ;;
    savemla) # three speed saves of the MLA cases (separate processes): the Gluon MLA forward's new program into the baseline
      for i in 1 2 3; do L=savemla$i; mj "$L" --cache /tmp/ac --timeout 150 -- --attnkit-impl=triton_flash,torch_sdpa --attnkit-suite=speed -k d192 --attnkit-baseline-dir=/tmp/bl --attnkit-save-baseline | grep -E "exit status|wall time|outcomes"
        grep -E "saved|pooled|gate" /tmp/r/$L/pytest.log | head -4; pack "$L"; done; cp /tmp/bl/nvidia*.json "$OUT/" ;;
    ncumla) mkdir -p $OUT/ncumla; for BY in cudnn triton; do F=$OUT/ncumla/mla-bwd-causal-$BY.txt
        timeout 120 ncu --target-processes all --launch-skip 8 --launch-count 8 --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --metrics $M python3 _lab/mla_ncu.py $BY > $F 2>&1; echo "$BY rc $?"
        grep -E "^  [a-zA-Z_].*\(|Duration|Grid Size|Block Size|Registers Per|Dynamic Shared|hmma|Warp Cycles Per Issued" $F | cut -c1-160 | head -40; done ;;
    sweepmla) mkdir -p $OUT/sweepmla; timeout 400 python3 tools/flash_bench/versions.py --version cur=implementations/triton_flash --sweep --sweep-kernels dkdv,dq --cases d192-dv128-4k-causal --reps 20 --out $OUT/sweepmla/sweep.json > $OUT/sweepmla/sweep.log 2>&1; echo "sweep rc $?"; tail -30 $OUT/sweepmla/sweep.log ;;
    win) # issue 42: sliding windows through the Gluon forward: the harness's windowed cases, correctness and speed
      L=${1:-win}; shift || true
      mj "$L" --cache /tmp/ac --timeout 330 -- --attnkit-impl=triton_flash,torch_sdpa,torch_flex --attnkit-suite=correctness,speed "-kcausal-w or bf16-w or fp16-w or f32-w" --attnkit-baseline-dir=/tmp/bl | grep -E "exit status|wall time|outcomes"
      grep -E "FAILED|forward: Gluon" /tmp/r/$L/pytest.log | cut -c1-200 | head -20; grep -A1 -E "^(triton_flash|torch_sdpa|torch_flex) +(fwd|bwd) .*-w4096" /tmp/r/$L/pytest.log | head -12; pack "$L" ;;
    savewin) # three speed saves of the windowed case (separate processes): the Gluon windowed forward's program into the baseline
      for i in 1 2 3; do L=savewin$i; mj "$L" --cache /tmp/ac --timeout 80 -- --attnkit-impl=triton_flash,torch_sdpa --attnkit-suite=speed -k "causal-w4096" --attnkit-baseline-dir=/tmp/bl --attnkit-save-baseline | grep -E "exit status|wall time|outcomes"
        grep -E "gate  " /tmp/r/$L/pytest.log | head -2; pack "$L"; done; cp /tmp/bl/nvidia*.json "$OUT/" ;;
    untried) # issue 42 v23: softcap and sinks through the Gluon forward (the switch on): the harness's cap/sinks cases
      L=${1:-untried}; shift || true
      ATTNKIT_TRITON_FLASH_GLUON_UNTRIED=1 mj "$L" --cache /tmp/ac --timeout 330 -- --attnkit-impl=triton_flash,torch_sdpa,torch_flex --attnkit-suite=correctness,speed "-kcap or sinks or alibi or d192" --attnkit-baseline-dir=/tmp/bl | grep -E "exit status|wall time|outcomes"
      grep -E "FAILED|forward: Gluon" /tmp/r/$L/pytest.log | cut -c1-200 | head -20; grep -A1 -E "^(triton_flash|torch_sdpa|torch_flex) +(fwd|bwd) .*cap30" /tmp/r/$L/pytest.log | head -12; pack "$L" ;;
    mlabwd) # issue 42 v24: the Gluon backward's MLA: its check (no variants; d64/d128/d192), then the harness's d192 cases with the switch on
      L=${1:-mlabwd}; shift || true; mkdir -p /tmp/r/$L $OUT/$L; nvidia-smi --query-gpu=name,serial --format=csv,noheader > $OUT/$L/device.txt; date -u >> $OUT/$L/device.txt
      timeout 300 python3 tools/flash_bench/gluon_bwd_check.py --out /tmp/r/$L/check --variants "" --case-timeout 60 > /tmp/r/$L/check.log 2>&1; echo "bwdcheck rc $?"
      cp /tmp/r/$L/check/check.md $OUT/$L/ 2>/dev/null; gzip -c /tmp/r/$L/check/check.json > $OUT/$L/check.json.gz 2>/dev/null; tail -3 /tmp/r/$L/check.log > $OUT/$L/check-tail.txt
      grep -E "FAIL|hung|ERROR" /tmp/r/$L/check.log | head -20; grep -E "d192|passed" /tmp/r/$L/check/check.md | head -12
      ATTNKIT_TRITON_FLASH_GLUON_BWD=1 mj "$L-harness" --cache /tmp/ac --timeout 200 -- --attnkit-impl=triton_flash,torch_sdpa --attnkit-suite=correctness,speed -k d192 --attnkit-baseline-dir=/tmp/bl | grep -E "exit status|wall time|outcomes"
      grep -A1 -E "^(triton_flash|torch_sdpa) +bwd .*d192" /tmp/r/$L-harness/pytest.log | head -8; grep FAILED /tmp/r/$L-harness/pytest.log | head; pack "$L-harness" ;;
    mlahang) for P in "A causal 300" "A full 200" "B causal 200" "C causal 3" "C full 2"; do echo "== $P"; timeout 60 python3 _lab/mlahang.py $P 45 2>&1 | tail -25; echo "rc ${PIPESTATUS[0]}"; done
      echo "== harness speed d192 triton_flash, switch on"; ATTNKIT_TRITON_FLASH_GLUON_BWD=1 timeout 100 python3 -m pytest --attnkit --attnkit-impl=triton_flash --attnkit-suite=speed -k "d192 and backward" --attnkit-cache-dir=/tmp/ac -p no:cacheprovider -q -x 2>&1 | tail -15 ;;
    hangrepro) # the mlabwd1 harness command again, up to 3 times; on a hang: nvidia-smi, then SIGUSR1 to the workers (faulthandler)
      N=${1:-3}; shift || true; mkdir -p $OUT/hang; for i in $(seq 1 $N); do
        ATTNKIT_TRITON_FLASH_GLUON_BWD=1 timeout 150 python3 -m pytest --attnkit --attnkit-impl=triton_flash,torch_sdpa --attnkit-suite=correctness,speed -k d192 --attnkit-cache-dir=/tmp/ac --attnkit-baseline-dir=/tmp/bl -p no:cacheprovider -q -rs > $OUT/hang/run$i.log 2>&1 &
        P=$!; for t in $(seq 1 60); do sleep 1; kill -0 $P 2>/dev/null || break; done
        if kill -0 $P 2>/dev/null; then echo "run $i: still running at 60 s"; nvidia-smi > $OUT/hang/smi$i.txt; nvidia-smi --query-gpu=utilization.gpu,clocks.sm,power.draw --format=csv >> $OUT/hang/smi$i.txt; cat $OUT/hang/smi$i.txt | tail -12
          ps aux | grep -E "pytest_attnkit.worker" | grep -v grep > $OUT/hang/ps$i.txt; pkill -USR1 -f "pytest_attnkit.worker"; sleep 4; cp -r /tmp/attnkit-workers-* $OUT/hang/ 2>/dev/null; ls -R $OUT/hang | head; kill $P; wait $P; break
        else wait $P; echo "run $i: rc $? in time"; tail -3 $OUT/hang/run$i.log; fi
      done ;;
    stress) # four processes at once: three autograd loops (B) and one check loop (A), causal MLA backward through Gluon
      for j in 1 2 3; do timeout 100 python3 _lab/mlahang.py B causal 400 90 > /tmp/st$j.log 2>&1 & done
      timeout 100 python3 _lab/mlahang.py A causal 1500 90 > /tmp/st4.log 2>&1 & wait
      for j in 1 2 3 4; do echo "-- stress $j"; tail -4 /tmp/st$j.log; done ;;
    stress2) # four processes at once, each kind: the d128 Gluon backward (A), then the MLA forward (F)
      for K in "A causal 3000 60 128" "F causal 6000 60 192"; do echo "=== 4 x $K"
        for j in 1 2 3 4; do timeout 70 python3 _lab/mlahang.py $K > /tmp/s2$j.log 2>&1 & done
        sleep 50; nvidia-smi --query-gpu=utilization.gpu,clocks.sm,power.draw --format=csv,noheader; wait
        for j in 1 2 3 4; do tail -2 /tmp/s2$j.log | cut -c1-160; done; done ;;
    stress3) # the d128 Gluon backward: one process alone (3000 calls), then two at once
      echo "=== 1 x A causal 3000 d128"; timeout 70 python3 _lab/mlahang.py A causal 3000 60 128 2>&1 | tail -2 | cut -c1-160
      echo "=== 2 x A causal 3000 d128"; for j in 1 2; do timeout 70 python3 _lab/mlahang.py A causal 3000 60 128 > /tmp/s3$j.log 2>&1 & done
      sleep 40; nvidia-smi --query-gpu=utilization.gpu,clocks.sm,power.draw --format=csv,noheader; wait
      for j in 1 2; do grep -E "calls ok" /tmp/s3$j.log | tail -1; tail -1 /tmp/s3$j.log | cut -c1-160; done ;;
    stress4) # the d128 Gluon backward with dQ by atomics (m64s2, no TMA reduce), two processes at once
      for j in 1 2; do timeout 50 python3 _lab/mlahang.py A causal 3000 45 128 m64s2 > /tmp/s4$j.log 2>&1 & done
      sleep 35; nvidia-smi --query-gpu=utilization.gpu,clocks.sm,power.draw --format=csv,noheader; wait
      for j in 1 2; do head -2 /tmp/s4$j.log; grep -E "calls ok" /tmp/s4$j.log | tail -1; tail -1 /tmp/s4$j.log | cut -c1-160; done ;;
    share) # issue 42 v26: the Gluon backward's fix under a shared GPU (tools/flash_bench/share_check.py), 30 s each;
      # the control: the kernel before the fix (_lab/gluon_backward_old.py: git show 97146ad:implementations/triton_flash/gluon_backward.py)
      mkdir -p $OUT/share; nvidia-smi --query-gpu=name,serial --format=csv,noheader > $OUT/share/device.txt; date -u >> $OUT/share/device.txt
      SC="python3 tools/flash_bench/share_check.py --seconds 30 --stall 15"
      for R in "d128c|--run 'bwd d128 causal' --run 'bwd d128 causal'" "mla|--run 'bwd d192 causal' --run 'bwd d192 causal'" \
               "d128pair|--run 'bwd d128' --run 'bwd d128'" "fwd16k|--run 'fwd d128 b1 n16384' --run 'fwd d128 b1 n16384 causal'" \
               "sleep|--run 'bwd d128 causal' --run sleep"; do
        L=${R%%|*}; A=${R#*|}; echo "== $L"; eval timeout 150 $SC $A --out $OUT/share/$L.json 2>&1 | tail -12
        if [ $L = d128c ] && grep -q '"exit_status": 2' $OUT/share/d128c.json; then  # the fix did not hold: the next suspect
          echo "== d128c-r232 (the producer at 48 registers, not 24)"; timeout 150 $SC --run 'bwd d128 causal config=m64s2-tmar-sw-r232' --run 'bwd d128 causal config=m64s2-tmar-sw-r232' --out $OUT/share/d128c-r232.json 2>&1 | tail -12; fi; done
      rm -rf /tmp/oldtree; cp -r . /tmp/oldtree; cp _lab/gluon_backward_old.py /tmp/oldtree/implementations/triton_flash/gluon_backward.py
      echo "== control: the kernel before the fix"; (cd /tmp/oldtree && timeout 150 $SC --run 'bwd d128 causal' --run 'bwd d128 causal' --out $OUT/share/control-old.json 2>&1 | tail -12) ;;
    share2) # share_check without a host wait per call: the control (the kernel before the fix) first, then the fix
      mkdir -p $OUT/share2; nvidia-smi --query-gpu=name,serial --format=csv,noheader > $OUT/share2/device.txt; date -u >> $OUT/share2/device.txt; git log --oneline -1 >> $OUT/share2/device.txt
      SC="python3 tools/flash_bench/share_check.py --seconds 30 --stall 15"
      rm -rf /tmp/oldtree; cp -r . /tmp/oldtree; cp _lab/gluon_backward_old.py /tmp/oldtree/implementations/triton_flash/gluon_backward.py
      echo "== control-old: the kernel before the fix"; (cd /tmp/oldtree && timeout 150 $SC --run 'bwd d128 causal' --run 'bwd d128 causal' --out $OUT/share2/control-old.json 2>&1 | tail -12)
      if ! grep -q '"exit_status": 2' $OUT/share2/control-old.json; then echo "== control-old-stress3 (session 19's probe)"; (cd /tmp/oldtree; for j in 1 2; do timeout 70 python3 _lab/mlahang.py A causal 3000 60 128 > /tmp/o3$j.log 2>&1 & done; wait; for j in 1 2; do grep -E "calls ok" /tmp/o3$j.log | tail -1; tail -1 /tmp/o3$j.log | cut -c1-160; done) | tee $OUT/share2/control-old-stress3.txt; fi
      for R in "d128c|--run 'bwd d128 causal' --run 'bwd d128 causal'" "mla|--run 'bwd d192 causal' --run 'bwd d192 causal'" \
               "d128|--run 'bwd d128' --run 'bwd d128'" "fwd16k|--run 'fwd d128 b1 n16384' --run 'fwd d128 b1 n16384 causal'" \
               "three|--run 'bwd d128 causal' --run 'bwd d192' --run 'fwd d128 causal'"; do
        L=${R%%|*}; A=${R#*|}; echo "== $L"; eval timeout 150 $SC $A --out $OUT/share2/$L.json 2>&1 | tail -8; done ;;
    gbwd) # the whole main job with the Gluon backward switched on (v26's fix): no hang, every case right?
      L=$1; shift; ATTNKIT_TRITON_FLASH_GLUON_BWD=1 mj "$L" --cache /tmp/ac --timeout 420 -- $IMPLS --attnkit-baseline-dir=/tmp/bl | grep -E "exit status|wall time|outcomes|timeline"
      grep -E "FAILED|backward: Gluon" /tmp/r/$L/pytest.log | cut -c1-160 | head -12; pack "$L" ;;
    vbroken) # gluon_check's attention-variant cases on two broken copies of the Gluon forward: a sink logit
      # converted to base 2 with 1.3 instead of log2(e), and a softcap 2% off; each must FAIL its cases
      for B in "sinks|s/gl.load(sinks_ptr + off_h) \* 1.4426950408889634/gl.load(sinks_ptr + off_h) * 1.3/" \
               "softcap|s/(softcap \* LOG2E, scale \/ softcap)/(softcap * LOG2E, scale \/ (softcap * 1.02))/"; do
        # in place: the editable install maps pytest_attnkit.implementations to this tree, so a copy elsewhere would check the right kernel
        N=${B%%|*}; E=${B#*|}; F=implementations/triton_flash/gluon_forward.py; cp $F /tmp/gf-saved.py; sed -i "$E" $F
        diff /tmp/gf-saved.py $F | grep "^[<>]" | tee $OUT/vbroken-$N.diff
        mkdir -p $OUT/vbroken-$N; timeout 150 python3 tools/flash_bench/gluon_check.py --out /tmp/r/vb-$N --variants "" --case-timeout 60 --skip-timing > /tmp/r/vb-$N.log 2>&1; echo "vbroken $N: gluon_check rc $?"
        cp /tmp/gf-saved.py $F
        cp /tmp/r/vb-$N/check.md $OUT/vbroken-$N/ 2>/dev/null; grep -E "^## Correctness" -A3 /tmp/r/vb-$N/check.md | head -5; grep -c FAIL /tmp/r/vb-$N.log; done ;;
    savebwd) # the Gluon backward's programs (v27's default) into the baseline: three speed saves of the backward cases
      for i in 1 2 3; do L=savebwd$i; mj "$L" --cache /tmp/ac --timeout 170 -- --attnkit-impl=triton_flash,torch_sdpa --attnkit-suite=speed -k "backward" --attnkit-baseline-dir=/tmp/bl --attnkit-save-baseline | grep -E "exit status|wall time|outcomes"
        grep -E "gate  " /tmp/r/$L/pytest.log | head -2; pack "$L"; done; cp /tmp/bl/nvidia*.json "$OUT/" ;;
    savecap) # the softcap forward's new program (Gluon, v25) into the baseline: three speed saves, separate processes
      for i in 1 2 3; do L=savecap$i; mj "$L" --cache /tmp/ac --timeout 120 -- --attnkit-impl=triton_flash,torch_sdpa --attnkit-suite=speed -k cap30 --attnkit-baseline-dir=/tmp/bl --attnkit-save-baseline | grep -E "exit status|wall time|outcomes"
        grep -E "gate  " /tmp/r/$L/pytest.log | head -2; pack "$L"; done; cp /tmp/bl/nvidia*.json "$OUT/" ;;
    vcheck) # issue 42: the Gluon forward's check with its attention variants (windows, ALiBi, softcap, sinks; MLA with them too)
      L=${1:-vcheck}; shift || true; mkdir -p /tmp/r/$L $OUT/$L; nvidia-smi --query-gpu=name,serial --format=csv,noheader > $OUT/$L/device.txt; date -u >> $OUT/$L/device.txt
      timeout 500 python3 tools/flash_bench/gluon_check.py --out /tmp/r/$L/check --variants "" --case-timeout 90 --skip-timing > /tmp/r/$L/check.log 2>&1; echo "gluon_check rc $?"
      cp /tmp/r/$L/check/check.md $OUT/$L/ 2>/dev/null; gzip -c /tmp/r/$L/check/check.json > $OUT/$L/check.json.gz 2>/dev/null; tail -3 /tmp/r/$L/check.log > $OUT/$L/check-tail.txt
      grep -E "FAIL|HANG|CRASH|COMPILE" /tmp/r/$L/check.log | head -20; head -12 /tmp/r/$L/check/check.md ;;
    ncumlab) # issue 42: the Gluon MLA backward (b4-h16-q4096 d192/dv128, causal) under Nsight Compute, stall reasons per SASS line; d128 causal beside it
      mkdir -p $OUT/ncumlab; { nvidia-smi --query-gpu=name,serial,clocks.sm --format=csv,noheader; date -u; git log --oneline -1; } > $OUT/ncumlab/device.txt
      for C in "bwd-bf16-d192-4k mla-causal" ${NCU_D128:+"bwd-bf16-d128-4k d128-causal"}; do read -r CS N <<< "$C"
        timeout 200 ncu --target-processes all --nvtx --nvtx-include "profiled/" -k regex:_attn_bwd_sm90 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters --section InstructionStats --section LaunchStats --metrics $M -o /tmp/$N -f python3 tools/flash_bench/ncu_case.py $CS --causal --by gluon > $OUT/ncumlab/$N.log 2>&1; echo "$N rc $?"; tail -3 $OUT/ncumlab/$N.log
        ncu -i /tmp/$N.ncu-rep --page details > $OUT/ncumlab/$N-details.txt 2>&1
        ncu -i /tmp/$N.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $OUT/ncumlab/$N-sass.csv.gz
        grep -E "Duration|hmma|issue_active|Registers Per|Local|Warp Cycles Per Issued|No Eligible|Stall" $OUT/ncumlab/$N-details.txt | cut -c1-150 | head -24; done ;;
    mlahalf) # issue 42 v29: the MLA backward with S and dP in two 32-key halves (no serialized wgmma): the backward check (d64/d128/d192 defaults), then the harness's d192 cases
      L=${1:-mlahalf}; shift || true; mkdir -p /tmp/r/$L $OUT/$L; { nvidia-smi --query-gpu=name,serial --format=csv,noheader; date -u; git log --oneline -1; git diff --stat; } > $OUT/$L/device.txt
      timeout 300 python3 tools/flash_bench/gluon_bwd_check.py --out /tmp/r/$L/check --variants "" --case-timeout 60 > /tmp/r/$L/check.log 2>&1; echo "bwdcheck rc $?"
      cp /tmp/r/$L/check/check.md $OUT/$L/ 2>/dev/null; gzip -c /tmp/r/$L/check/check.json > $OUT/$L/check.json.gz 2>/dev/null; tail -3 /tmp/r/$L/check.log > $OUT/$L/check-tail.txt
      grep -E "FAIL|hung|ERROR" /tmp/r/$L/check.log | head -20; grep -E "^## |d192|passed" /tmp/r/$L/check/check.md | head -16
      mj "$L-harness" --cache /tmp/ac --timeout 200 -- --attnkit-impl=triton_flash,torch_sdpa --attnkit-suite=correctness,speed -k d192 --attnkit-baseline-dir=/tmp/bl | grep -E "exit status|wall time|outcomes"
      grep -A1 -E "^(triton_flash|torch_sdpa) +(fwd|bwd) .*d192" /tmp/r/$L-harness/pytest.log | head -8; grep -E "FAILED|backward: " /tmp/r/$L-harness/pytest.log | cut -c1-160 | head; pack "$L-harness" ;;
    ldcheck) # issue 42 v29: -ld (descriptors made in the loop) for d64/d128 beside the defaults: right, and timed in turns
      L=${1:-ldcheck}; shift || true; mkdir -p /tmp/r/$L $OUT/$L; { nvidia-smi --query-gpu=name,serial --format=csv,noheader; date -u; git log --oneline -1; } > $OUT/$L/device.txt
      timeout 420 python3 tools/flash_bench/gluon_bwd_check.py --out /tmp/r/$L --variants m64s2-tmar-sw-ld,m64s2-tmar-sw-pair-ld,m64s3-tmar-sw-pair-ld --case-timeout 60 > /tmp/r/$L/run.log 2>&1; echo "bwdcheck rc $?"
      cp /tmp/r/$L/check.md $OUT/$L/; gzip -c /tmp/r/$L/check.json > $OUT/$L/check.json.gz; tail -3 /tmp/r/$L/run.log > $OUT/$L/tail.txt
      grep -E "FAIL|hung|ERROR" /tmp/r/$L/run.log | head; tail -40 /tmp/r/$L/check.md ;;
    dq32) # issue 42 v29's next: the MLA backward's dQ in 32-column pieces (results/2026-11-29-session21/mla/next-dq32.diff), checked, then the harness's d192 cases; the tree restored
      L=${1:-dq32}; shift || true; P=results/2026-11-29-session21/mla/next-dq32.diff; git apply $P || exit 1
      mkdir -p /tmp/r/$L $OUT/$L; { nvidia-smi --query-gpu=name,serial --format=csv,noheader; date -u; git log --oneline -1; git diff --stat; } > $OUT/$L/device.txt
      timeout 300 python3 tools/flash_bench/gluon_bwd_check.py --out /tmp/r/$L/check --variants "" --case-timeout 60 > /tmp/r/$L/check.log 2>&1; echo "bwdcheck rc $?"
      cp /tmp/r/$L/check/check.md $OUT/$L/; tail -3 /tmp/r/$L/check.log > $OUT/$L/check-tail.txt; grep -E "FAIL|hung|ERROR" /tmp/r/$L/check.log | head; grep -E "^## |d192" /tmp/r/$L/check/check.md | head -8
      mj "$L-harness" --cache /tmp/ac --timeout 200 -- --attnkit-impl=triton_flash,torch_sdpa --attnkit-suite=correctness,speed -k d192 --attnkit-baseline-dir=/tmp/bl | grep -E "exit status|wall time|outcomes"
      grep -A1 -E "^(triton_flash|torch_sdpa) +bwd .*d192" /tmp/r/$L-harness/pytest.log | head -4; pack "$L-harness"; git apply -R $P ;;
    dkdvstages) # NOTES v29: the Triton dK/dV kernel at d64 without causal, s3 (serialized under 3.6) against s2
      mkdir -p $OUT/dkdvstages; { nvidia-smi --query-gpu=name,serial --format=csv,noheader; date -u; git log --oneline -1; } > $OUT/dkdvstages/device.txt
      timeout 300 python3 _lab/dkdv_stages.py 2>&1 | tee $OUT/dkdvstages/run.txt | tail -8 ;;
    defcheck) # the backward check on the defaults alone (v30: -ld for d64/d128, Gluon for every d128 causal call)
      L=${1:-defcheck}; shift || true; mkdir -p /tmp/r/$L $OUT/$L; { nvidia-smi --query-gpu=name,serial --format=csv,noheader; date -u; git log --oneline -1; git diff --stat; } > $OUT/$L/device.txt
      timeout 300 python3 tools/flash_bench/gluon_bwd_check.py --out /tmp/r/$L --variants "" --case-timeout 60 > /tmp/r/$L/run.log 2>&1; echo "bwdcheck rc $?"
      cp /tmp/r/$L/check.md $OUT/$L/; gzip -c /tmp/r/$L/check.json > $OUT/$L/check.json.gz; tail -3 /tmp/r/$L/run.log > $OUT/$L/tail.txt
      grep -E "FAIL|hung|ERROR" /tmp/r/$L/run.log | head; grep -E "^## |^\| b" /tmp/r/$L/check.md | head -16 ;;
    ltcheck) # issue 42 v30's and v33's next: -lt (L and delta by TMA into the ring), -rl (the causal mask by row limits), -dqp (dQ's two pieces in flight), compile-only until this runs
      L=${1:-ltcheck}; shift || true; mkdir -p /tmp/r/$L $OUT/$L; { nvidia-smi --query-gpu=name,serial --format=csv,noheader; date -u; git log --oneline -1; git diff --stat; } > $OUT/$L/device.txt
      timeout 480 python3 tools/flash_bench/gluon_bwd_check.py --out /tmp/r/$L --variants m64s2-tmar-sw-ld-lt-rl,m64s2-tmar-sw-ld-rl,m64s2-tmar-sw-ld-lt,m64s3-tmar-sw-pair-ld-lt,m64s2-tmar-sw-ld-dqp,m64s2-tmar-sw-ld-lt-rl-dqp --no-alibi-window --case-timeout 60 > /tmp/r/$L/run.log 2>&1; echo "bwdcheck rc $?"
      cp /tmp/r/$L/check.md $OUT/$L/; gzip -c /tmp/r/$L/check.json > $OUT/$L/check.json.gz; tail -3 /tmp/r/$L/run.log > $OUT/$L/tail.txt
      grep -E "FAIL|hung|ERROR" /tmp/r/$L/run.log | head; tail -24 /tmp/r/$L/check.md ;;
    alicheck) # issue 42 v31/v32: ALiBi and windows through the Gluon backward (compile-only until this runs): 80 cases right?, timed beside the Triton backward
      L=${1:-alicheck}; shift || true; mkdir -p /tmp/r/$L $OUT/$L; { nvidia-smi --query-gpu=name,serial --format=csv,noheader; date -u; git log --oneline -1; git diff --stat; } > $OUT/$L/device.txt
      timeout 500 python3 tools/flash_bench/gluon_bwd_check.py --out /tmp/r/$L --alibi-window-only --case-timeout 60 > /tmp/r/$L/run.log 2>&1; echo "bwdcheck rc $?"
      cp /tmp/r/$L/check.md $OUT/$L/; gzip -c /tmp/r/$L/check.json > $OUT/$L/check.json.gz; tail -3 /tmp/r/$L/run.log > $OUT/$L/tail.txt
      grep -E "FAIL|hung|ERROR" /tmp/r/$L/run.log | head; grep -E "^## Corr|worst|alibi|w[0-9]+:" /tmp/r/$L/check.md | tail -10 ;;
    ncult) # the d128 causal 4k backward with -lt-rl under Nsight Compute (stall reasons: results/2026-11-29-session22/ncu/reasons.py)
      mkdir -p $OUT/ncult; { nvidia-smi --query-gpu=name,serial,clocks.sm --format=csv,noheader; date -u; git log --oneline -1; } > $OUT/ncult/device.txt
      N=d128-causal-lt; timeout 200 ncu --target-processes all --nvtx --nvtx-include "profiled/" -k regex:_attn_bwd_sm90 --section SpeedOfLight --section WarpStateStats --section SourceCounters --metrics $M -o /tmp/$N -f python3 tools/flash_bench/ncu_case.py bwd-bf16-d128-4k-m64s2-tmar-sw-ld-lt-rl --causal --by gluon > $OUT/ncult/$N.log 2>&1; echo "$N rc $?"
      ncu -i /tmp/$N.ncu-rep --page details > $OUT/ncult/$N-details.txt 2>&1; ncu -i /tmp/$N.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $OUT/ncult/$N-sass.csv.gz
      python3 results/2026-11-29-session22/ncu/reasons.py $OUT/ncult/$N-sass.csv.gz; grep -E "Duration|hmma" $OUT/ncult/$N-details.txt ;;
    saveflex) # session 22's gate change: torch_flex's runs saved with their minor kernels marked (3 saves), so that a program differing only in them is judged
      for i in 1 2 3; do L=saveflex$i; mj "$L" --cache /tmp/ac --timeout 170 -- --attnkit-impl=torch_flex,torch_sdpa --attnkit-suite=speed --attnkit-baseline-dir=/tmp/bl --attnkit-save-baseline | grep -E "exit status|wall time|outcomes"
        grep -E "gate  " /tmp/r/$L/pytest.log | head -2; echo "minor marks in the report: $(grep -o "~minor" /tmp/r/$L/attnkit-report.json | wc -l)"; pack "$L"; done; cp /tmp/bl/nvidia*.json "$OUT/" ;;
    cmp) python3 tools/main_job_time.py compare /tmp/r/$1/attnkit-report.json /tmp/r/$2/attnkit-report.json | tail -15; shift 2 ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
