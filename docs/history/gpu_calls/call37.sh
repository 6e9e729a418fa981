#!/usr/bin/env bash
# Twenty-third session: main's review mends (533a60d, 00e9d87: compiled, not GPU-run) with the
# branch sample-blocks merged. 1) call36 (the sampling tests on both paths, then temperature 1
# one-block / many-block interleaved, resident and host tier); 2) every GPU test (gpu-check).
# About 7 minutes. Carry .carry/bins.txz (sluice, sluice_gpu_tests, bench_cuda).
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xJf .carry/bins.txz -C .carry
T0=$(date +%s)
LIMIT=230 bash bench/gpu_calls/call36.sh
echo "call36 part done at $(( $(date +%s)-T0 )) s"
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
timeout 330 bash scripts/gpu-check .carry/bin 2>&1 | grep -vE "^\[       OK \]" | tail -30
echo "total $(( $(date +%s)-T0 )) s"
