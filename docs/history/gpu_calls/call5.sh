#!/usr/bin/env bash
# Issue 13, fifteenth session: early launches (SLUICE_CUDA_EARLY; common.cuh's
# chained_kernel_entry(bool), matvec.cu's weights loaded ahead). 1) the two new tests, then
# every GPU test (the families' device-routed default of the fourteenth session had not run
# since its flip); 2) bench_cuda --model on a 12-layer qwen3-30b-a3b q4 synthetic, decode
# after 512 and 8192 tokens, early on / off interleaved, two runs each. About 8 minutes.
# Build here first: make build && scripts/carry-build; run from the repository root carrying .carry.
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
timeout 120 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter='CudaOps.MatvecWeightsLoadedAheadBitForBit:*CudaGraph.EarlyLaunchesDecodeBitForBit*' > $OUT/early_tests.log 2>&1
echo "early-launch tests rc $? at $(( $(date +%s)-T0 )) s"
grep -E "^\[  (PASSED|FAILED) |^\[==========\]|^\[  FAILED  \] [A-Z]|Failure|rror" $OUT/early_tests.log | head -20
timeout 330 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter='-CudaOps.MatvecWeightsLoadedAheadBitForBit:*CudaGraph.EarlyLaunchesDecodeBitForBit*' > $OUT/gpu_tests.log 2>&1
echo "every other gpu test rc $? at $(( $(date +%s)-T0 )) s"
grep -E "^\[  (PASSED|FAILED) |^\[==========\]|^\[  FAILED  \] [A-Z]" $OUT/gpu_tests.log | head -20
timeout 200 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 /tmp/q3 --force -q > $OUT/synth.log 2>&1 || tail -3 $OUT/synth.log
echo "synth at $(( $(date +%s)-T0 )) s"
for P in 512 8192; do
  for rep in 1 2; do
    for e in 1 0; do
      [ $(( $(date +%s)-T0 )) -lt 560 ] || break 3
      echo "## prompt $P, early $e, run $rep"
      SLUICE_CUDA_EARLY=$e timeout 60 .carry/bin/bench_cuda --model /tmp/q3 --prefill $P --decode 128 --reps 2 2>&1 | grep -E "^\| [0-9]|rror" | head -4
    done
  done
done
rm -rf /tmp/q3
echo "total $(( $(date +%s)-T0 )) s"
