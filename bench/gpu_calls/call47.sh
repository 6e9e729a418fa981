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
timeout $left scripts/gpu-check .carry/bin > $OUT/gpu-check.txt 2>&1
echo "gpu-check rc $? (timeout ${left} s)"
grep -vE "^\[       OK" $OUT/gpu-check.txt | tail -14
echo "passed so far: $(grep -c '^\[       OK' $OUT/gpu-check.txt)"
echo "total $(( $(date +%s)-T0 )) s"
