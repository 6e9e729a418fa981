#!/usr/bin/env bash
# Twenty-seventh session, second call: every GPU test with SLUICE_CUDA_MOE_BULK removed, then
# call55.sh (the side by side, then the 48-layer roofline in the time left) within LIMIT
# seconds in all (default 585). About 8 minutes. Carry .carry/bins.txz (no PTX) and .carry/peer.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/bench_cuda ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
timeout 240 .carry/bin/sluice_gpu_tests --gtest_color=no > $OUT/gpu-tests.log 2>&1
echo "GPU tests rc $? at $(( $(date +%s)-T0 )) s: passed $(grep -c '^\[       OK' $OUT/gpu-tests.log), failed $(grep -cE '^\[  FAILED  \] .*\([0-9]+ ms\)$' $OUT/gpu-tests.log), of $(grep -o 'Running [0-9]* tests' $OUT/gpu-tests.log)"
grep -E "^\[  FAILED|Failure|Expected|Which is" $OUT/gpu-tests.log | sed 's/ ([0-9]* ms)//' | sort | uniq -c | sort -rn | head -12
LIMIT=$(( ${LIMIT:-585} - ($(date +%s) - T0) )) bash bench/gpu_calls/call55.sh
