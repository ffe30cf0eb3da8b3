#!/usr/bin/env bash
# usage: bash _lab/dev.sh STEP [LABEL] [STEP [LABEL]...]  (device machine)
set -uo pipefail
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
        timeout 580 python3 -m pytest --attnkit --attnkit-suite=sanitize $IMPLS --attnkit-cache-dir=/tmp/ac -p no:cacheprovider -rs -q --attnkit-report=/tmp/r/$L/report; echo "exit $?"
        echo "wall $(python3 -c "import time;print(round(time.time()-$s,1))") s"
        echo "+ pytest tests/suites/test_sanitize.py -k on_the_gpu -rs -q -p no:cacheprovider"
        s=$(date +%s.%N)
        timeout 300 python3 -m pytest tests/suites/test_sanitize.py -k on_the_gpu -rs -q -p no:cacheprovider; echo "exit $?"
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
    cmp) python3 tools/main_job_time.py compare /tmp/r/$1/attnkit-report.json /tmp/r/$2/attnkit-report.json | tail -15; shift 2 ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
