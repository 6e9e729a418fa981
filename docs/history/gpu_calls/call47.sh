#!/usr/bin/env bash
# Twenty-fourth session: the side by side (../shared/peer, 12 layers) with the binaries of the
# branch decode-mma (the decode attention on tensor cores, the state's rotary tables filled
# once), then every GPU test in the time left. About 9.5 minutes. Carry .carry/bins.txz
# (sluice, bench_cuda, sluice_gpu_tests) and .carry/peer.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/bench_cuda ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
OUT=$OUT/sbs bash .carry/peer/side_by_side.sh .carry/bin 12
echo "side by side done at $(( $(date +%s)-T0 )) s"
left=$(( 585 - ($(date +%s) - T0) ))
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout $left .carry/bin/sluice_gpu_tests --gtest_color=no > $OUT/gpu-tests.log 2>&1
echo "GPU tests rc $? (timeout ${left} s): passed $(grep -c '^\[       OK' $OUT/gpu-tests.log), failed $(grep -cE '^\[  FAILED  \] .*\([0-9]+ ms\)$' $OUT/gpu-tests.log), of $(grep -o 'Running [0-9]* tests' $OUT/gpu-tests.log)"
grep -E "max \|logit|^\[  FAILED|Failure|Expected|Which is" $OUT/gpu-tests.log | sed 's/ ([0-9]* ms)//' | sort | uniq -c | sort -rn | head -12
echo "total $(( $(date +%s)-T0 )) s"
