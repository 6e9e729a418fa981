#!/usr/bin/env bash
# Issue 13, sixteenth session, first call: 1) every GPU test on the binaries of 5444bb8 (the
# early paths as their own kernel instantiations, a64bbf1, had not run on a GPU); 2) call7's
# early split (SLUICE_CUDA_EARLY=0 / attention / 1, decode after 512 and 8192 tokens on the
# 12-layer qwen3-30b-a3b q4 synthetic, interleaved, two rounds) against the plain path at its
# own registers again. About 4.5 minutes.
# Build here first: make build && scripts/carry-build; run from the repository root carrying .carry/bins.txz.
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
timeout 300 .carry/bin/sluice_gpu_tests --gtest_color=no > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc $? at $(( $(date +%s)-T0 )) s"
grep -E "^\[  (PASSED|FAILED) |^\[==========\]|^\[  FAILED  \] [A-Z]" $OUT/gpu_tests.log | head -20
bash bench/gpu_calls/call7.sh 2>&1 | grep -v "^tar"
echo "total $(( $(date +%s)-T0 )) s"
