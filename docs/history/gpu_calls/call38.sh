#!/usr/bin/env bash
# Twenty-third session: top-k and top-p draws over many blocks a row (sample_blocks.cu; every
# sampled rule there now, SLUICE_CUDA_SAMPLE_BLOCKS=0 keeps the one-block kernel). 1) the
# sampling tests (both paths against the CPU rule; the draws' frequencies), the sample-step and
# batch-sample tests; 2) on the 12-layer qwen3-30b-a3b q4 synthetic, resident, 128 tokens
# (seed 1), one block / many blocks interleaved for four rules, greedy beside; 3) every GPU
# test (gpu-check). About 6 minutes. Carry .carry/bins.txz (sluice, sluice_gpu_tests).
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter='CudaSample.*:*CudaSampleStep*:*BatchSample*' > $OUT/test.log 2>&1
echo "tests: rc $? at $(( $(date +%s)-T0 )) s"
grep -E "^\[  (PASSED|FAILED) |^\[       OK|Failure|Expected|Which is|token .* (is|logit)|many blocks|one block" $OUT/test.log | head -60
P=/tmp/q12
timeout 30 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 $P --force -q > /dev/null 2>&1
run() { local b=$1; shift
  SLUICE_CUDA_SAMPLE_BLOCKS=$b timeout 30 .carry/bin/sluice run --model $P --backend cuda --ignore-eos --seed 1 -n 128 \
    --tokens 1 "$@" > /tmp/out.txt 2> /tmp/err.log
  echo "| $* | $b | $(grep -o "generated [0-9]* tokens, [0-9.]* tok/s" /tmp/err.log | grep -o "[0-9.]* tok/s") | $(md5sum < /tmp/out.txt | cut -c1-8) |"; }
echo "| rule | many blocks | decode | text md5 |"
echo "|---|---|---|---|"
for rule in "--temperature 1" "--temperature 0.8 --top-p 0.95" "--temperature 0.7 --top-k 40" "--temperature 0.8 --top-k 40 --top-p 0.95"; do
  for r in 1 2; do for b in 0 1; do run $b $rule; done; done
done
run 1 --temperature 0
echo "timing done at $(( $(date +%s)-T0 )) s"
timeout 300 bash scripts/gpu-check .carry/bin 2>&1 | grep -vE "^\[       OK \]|teacher-forced" | tail -15
echo "total $(( $(date +%s)-T0 )) s"
