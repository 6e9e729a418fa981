#!/usr/bin/env bash
# Twenty-fourth session, the branch decode-mma-rows: a batch decode step's rows on the
# tensor-core decode attention. 1) the attention op tests (attention_rows on bf16 caches among
# them), the batch graph tests; 2) bench_cuda --batch 8,32 after 8192-token prompts,
# SLUICE_CUDA_ATTENTION_MMA=0 / 1. About 2 minutes. Carry .carry/bins.txz
# (sluice, bench_cuda, sluice_gpu_tests).
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 80 .carry/bin/sluice_gpu_tests --gtest_color=no \
  --gtest_filter='CudaOps.*ttention*:*CudaGraph.Batch*' > $OUT/tests.log 2>&1
echo "tests: rc $? at $(( $(date +%s)-T0 )) s"; grep -E "^\[  (PASSED|FAILED) |Failure|Expected|Which is" $OUT/tests.log | head -20
P=/tmp/q12
timeout 60 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 $P --force -q > /dev/null 2>&1
for n in 8192; do for m in 0 1; do
  echo "## prompt $n, SLUICE_CUDA_ATTENTION_MMA=$m"
  SLUICE_CUDA_ATTENTION_MMA=$m timeout 120 .carry/bin/bench_cuda --model $P --prefill $n --decode 16 --reps 0 --batch 8,32 2>&1 \
    | grep -E "^\| (8|32) \|" | tail -2
done; done
echo "total $(( $(date +%s)-T0 )) s"
