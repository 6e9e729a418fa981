#!/usr/bin/env bash
# Twenty-fourth session: every GPU test with the binaries carried (the branch decode-mma on
# rope-rows: the decode attention on tensor cores, the state's rotary tables filled once, main's
# blind-next merge with the staged draw removed). About 4 minutes. Carry .carry/bins.txz (sluice, bench_cuda, sluice_gpu_tests).
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
timeout 500 scripts/gpu-check .carry/bin > $OUT/gpu-check.txt 2>&1
echo "gpu-check rc $?"
grep -vE "^\[       OK" $OUT/gpu-check.txt | tail -14
echo "total $(( $(date +%s)-T0 )) s"
