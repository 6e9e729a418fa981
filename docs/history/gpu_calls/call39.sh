#!/usr/bin/env bash
# Twenty-third session: where a sampled draw's time goes (SLUICE_CUDA_PROFILE=1: each kernel of
# the captured decode graph timed alone) for four rules on the 12-layer synthetic, resident;
# then CudaStreaming.SameRoutingAndTokensAsTheCpu repeated (it failed once in call38's full
# run, not again), its failure messages kept. About 3 minutes. Carry .carry/bins.txz.
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
P=/tmp/q12
timeout 30 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 $P --force -q > /dev/null 2>&1
for rule in "--temperature 1" "--temperature 0.8 --top-p 0.95" "--temperature 0.7 --top-k 40" "--temperature 0.8 --top-k 40 --top-p 0.95"; do
  echo "## $rule"
  SLUICE_CUDA_PROFILE=1 timeout 60 .carry/bin/sluice run --model $P --backend cuda --ignore-eos --seed 1 -n 3 --tokens 1 $rule 2>&1 >/dev/null \
    | grep -E "sample|graph replay|kernels alone" | grep -v "^profile: node" | head -12
done
echo "profiles done at $(( $(date +%s)-T0 )) s"
timeout 150 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_repeat=40 --gtest_break_on_failure=0 \
  --gtest_filter='CudaStreaming.SameRoutingAndTokensAsTheCpu' > $OUT/repeat.log 2>&1
echo "repeat: rc $?; passed $(grep -c '^\[       OK' $OUT/repeat.log), failed $(grep -c '^\[  FAILED  \] CudaStreaming.Same.*ms)' $OUT/repeat.log)"
grep -B2 -A8 "Failure" $OUT/repeat.log | head -40
echo "total $(( $(date +%s)-T0 )) s"
