#!/usr/bin/env bash
# The persistent decode MoE step (issue 13 stage 1; prepared in the fourteenth session, written
# without a GPU): 1) its two GPU tests, 2) bench_cuda --moe (the barrier's round trip; the routed
# layer chained against persistent at 3 and 2 blocks an SM), 3) bench_cuda --model on a 12-layer
# qwen3-30b-a3b q4 synthetic, decode after 512 and after 8192 tokens, the switch off / on (3 an SM)
# / on (2 an SM) in this one call. About 5 minutes.
# Build here first: make build && scripts/carry-build; run with the device tool from the repository root,
# carrying .carry: bash bench/gpu_calls/call0.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
# One process a test: a trapped barrier (10 s) or a launch error spoils the CUDA context for
# everything after it in the same process. A launch/capture error: once more without PDL.
for t in CudaMoe.PersistentStepIsTheChainBitForBit CudaGraph.PersistentMoeStepIsTheChainBitForBit; do
  timeout 150 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter="*$t*" > $OUT/$t.log 2>&1
  rc=$?; echo "$t rc $rc at $(( $(date +%s)-T0 )) s"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \] [A-Z]|Failure|rror|persistent steps" $OUT/$t.log | head -20
  if [ $rc -ne 0 ] && grep -qiE "cuda error|launch|capture" $OUT/$t.log; then
    SLUICE_CUDA_PDL=0 timeout 150 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter="*$t*" > $OUT/$t.nopdl.log 2>&1
    echo "$t with SLUICE_CUDA_PDL=0: rc $?"; grep -E "^\[  (PASSED|FAILED) |Failure|rror" $OUT/$t.nopdl.log | head -10
  fi
done
timeout 120 .carry/bin/bench_cuda --moe > $OUT/moe.md 2>&1; echo "bench --moe rc $? at $(( $(date +%s)-T0 )) s"; cat $OUT/moe.md
timeout 200 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 /tmp/q3 --force -q > $OUT/synth.log 2>&1 || tail -3 $OUT/synth.log
echo "synth at $(( $(date +%s)-T0 )) s"
for P in 512 8192; do
  for v in off on on2; do
    case $v in off) E="";; on) E="SLUICE_CUDA_PERSISTENT=1";; on2) E="SLUICE_CUDA_PERSISTENT=1 SLUICE_CUDA_PERSISTENT_BLOCKS=2";; esac
    echo "## prompt $P, persistent $v"
    env $E timeout 90 .carry/bin/bench_cuda --model /tmp/q3 --prefill $P --decode 128 --reps 2 2>&1 | grep -E "^\| [0-9]|rror" | head -4
  done
done
# Issue 14: the bf16 prefill products on cuBLAS with x's two larger parts (SLUICE_CUDA_PREFILL_PARTS=2)
# against three: the op test, transformers parity with it, prefill tok/s at 512 and 8192.
SLUICE_CUDA_PREFILL_PARTS=2 timeout 120 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter='CudaOps.MatmulCublasTwoParts:*CudaParity.*' > $OUT/parts2.log 2>&1
echo "two parts: tests rc $?"; grep -E "^\[  (PASSED|FAILED) |Failure|normalized squared|max \|" $OUT/parts2.log | head -20
for P in 512 8192; do
  for parts in 3 2; do
    echo "## prefill $P, $parts parts"
    SLUICE_CUDA_PREFILL_PARTS=$parts timeout 90 .carry/bin/bench_cuda --model /tmp/q3 --prefill $P --decode 4 --reps 3 2>&1 | grep -E "^\| [0-9]|rror" | head -3
  done
done
echo "total $(( $(date +%s)-T0 )) s"
