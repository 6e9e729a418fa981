#!/usr/bin/env bash
# Issue 13, seventeenth session: two launches fewer a decode layer, the attention inputs inside
# the decode GQA kernel (Backend::attention_with_inputs, SLUICE_CUDA_FUSED_INPUTS) and the
# router product with its top-k in one cluster launch (Backend::moe_routed_product,
# SLUICE_CUDA_ROUTER_CLUSTER). 1) every GPU test (the three new ones among them); 2) decode
# after 512 and 8192 tokens on the 12-layer qwen3-30b-a3b q4 synthetic with both off, each
# alone and both on, interleaved, two rounds; 3) the decode graph's kernels at 512 with both
# (SLUICE_CUDA_PROFILE=1). About 4 minutes.
# Runs on the binaries of 36b8c8d (the switches and tests it names were removed after this call,
# bench/RESULTS.md "The seventeenth session's GPU calls"): check that commit out, build there
# without PTX, CARRY_FROM=build-carry scripts/carry-build; carry .carry/bins.txz.
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
timeout 300 .carry/bin/sluice_gpu_tests --gtest_color=no > $OUT/gpu_tests.log 2>&1
echo "gpu tests rc $? at $(( $(date +%s)-T0 )) s"
grep -E "^\[  (PASSED|FAILED) |^\[==========\]|^\[  FAILED  \] [A-Z]" $OUT/gpu_tests.log | head -20
timeout 60 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 /tmp/q3 --force -q
for rep in 1 2; do
  for P in 512 8192; do
    for f in 00 10 01 11; do
      echo "## prompt $P, inputs inside ${f:0:1}, router cluster ${f:1:1}, run $rep: $(SLUICE_CUDA_FUSED_INPUTS=${f:0:1} SLUICE_CUDA_ROUTER_CLUSTER=${f:1:1} timeout 30 .carry/bin/bench_cuda --model /tmp/q3 --prefill $P --decode 128 --reps 2 2>&1 | grep -E "^\| [0-9]" | head -1)"
    done
  done
done
SLUICE_CUDA_PROFILE=1 timeout 60 .carry/bin/bench_cuda --model /tmp/q3 --prefill 512 --decode 3 --reps 0 > $OUT/profile512.txt 2>&1
grep -E "replay|attention|gqa|merge|inputs|router|matvec|moe|norm" $OUT/profile512.txt | head -24
echo "total $(( $(date +%s)-T0 )) s"
