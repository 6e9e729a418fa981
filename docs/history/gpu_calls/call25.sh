#!/usr/bin/env bash
# Twenty-first session: every GPU test at main (762c4c4: the review's fill_union_entries
# mend, compiled but not GPU-run last session), the 26 streaming and MoE tests first.
# About 4 minutes. Carry .carry/bins.txz.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/bench_cuda ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
.carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter='CudaStreaming.*:CudaMoe.*' 2>&1 | grep -E "^\[ +(FAILED|PASSED) +\]|tests ran|Failure" | head -20
echo "streaming done at $(( $(date +%s)-T0 )) s"
bash scripts/gpu-check .carry/bin 2>&1 | grep -vE "^\[       OK \]" | tail -30
echo "total $(( $(date +%s)-T0 )) s"
