#!/usr/bin/env bash
# For the session after the twenty-third (the branch blind-next, built and not yet run on a
# GPU): (a) the sampled draw's last block stages its slice's logits in shared memory before its
# walks (SLUICE_CUDA_SAMPLE_STAGED=0 reads them from global memory); (b) the copy kernel is one
# wave of blocks with 8 loads in flight a thread (SLUICE_CUDA_COPY_BLOCKS=528: the old grid's
# size, now with the loads in flight too); (c) top-k alone without the z launch
# (SLUICE_CUDA_SAMPLE_Z=1 runs it, as before). 1) the sampling tests (staged and unstaged ids
# compared), sample-step and streaming tests; 2) the 12-layer synthetic, resident, 128 tokens,
# three rules, staged off / on interleaved, top-k alone with / without the z launch, and the
# draw kernels timed alone
# (SLUICE_CUDA_PROFILE=1) both ways; 3) the host-RAM row (10% + preloaded host tier) and the
# disk row with 528 copy blocks / the default interleaved, with the host tier's H2D probe
# (copy engine against copy kernel). About 3 minutes. Carry .carry/bins.txz (sluice,
# sluice_gpu_tests).
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter='CudaSample.*:*CudaSampleStep*:*BatchSample*:CudaStreaming.*' > $OUT/test.log 2>&1
echo "tests: rc $? at $(( $(date +%s)-T0 )) s"
grep -E "^\[  (PASSED|FAILED) |Failure|Expected|Which is|differ" $OUT/test.log | head -30
P=/tmp/q12
timeout 30 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 $P --force -q > /dev/null 2>&1
run() { local st=$1; shift
  SLUICE_CUDA_SAMPLE_STAGED=$st timeout 30 .carry/bin/sluice run --model $P --backend cuda --ignore-eos --seed 1 -n 128 \
    --tokens 1 "$@" > /tmp/out.txt 2> /tmp/err.log
  echo "| $* | $st | $(grep -o "generated [0-9]* tokens, [0-9.]* tok/s" /tmp/err.log | grep -o "[0-9.]* tok/s") | $(md5sum < /tmp/out.txt | cut -c1-8) |"; }
echo "| rule | staged | decode | text md5 |"
echo "|---|---|---|---|"
for rule in "--temperature 1" "--temperature 0.7 --top-k 40" "--temperature 0.8 --top-k 40 --top-p 0.95"; do
  for r in 1 2; do for st in 0 1; do run $st $rule; done; done
done
echo "| top-k alone, z launch (1: the z kernel, normalized weights, as before) | tok/s | text md5 |"
echo "|---|---|---|"
for r in 1 2; do for z in 1 0; do
  SLUICE_CUDA_SAMPLE_Z=$z timeout 30 .carry/bin/sluice run --model $P --backend cuda --ignore-eos --seed 1 -n 128 \
    --tokens 1 --temperature 0.7 --top-k 40 > /tmp/out.txt 2> /tmp/err.log
  echo "| $z | $(grep -o "generated [0-9]* tokens, [0-9.]* tok/s" /tmp/err.log | grep -o "[0-9.]* tok/s") | $(md5sum < /tmp/out.txt | cut -c1-8) |"
done; done
for st in 0 1; do
  echo "## staged $st, --temperature 0.8 --top-k 40 --top-p 0.95"
  SLUICE_CUDA_SAMPLE_STAGED=$st SLUICE_CUDA_PROFILE=1 timeout 60 .carry/bin/sluice run --model $P --backend cuda --ignore-eos \
    --seed 1 -n 3 --tokens 1 --temperature 0.8 --top-k 40 --top-p 0.95 2>&1 >/dev/null \
    | grep -E "sample|graph replay" | grep -v "^profile: node" | head -8
done
c10=$(( $(stat -c %s $P/experts.q4.bin) / 10 ))
srun() { local cb=$1 tier=$2
  local host=""; [ $tier = ram ] && host="--host-cache 16G --host-cache-preload"
  SLUICE_CUDA_COPY_BLOCKS=$cb timeout 30 .carry/bin/sluice run --model $P --backend cuda --ignore-eos --temperature 0 \
    -n 128 --tokens 1 --expert-cache $c10 $host > /tmp/out.txt 2> /tmp/err.log
  echo "| $tier | $cb | $(grep -o "generated [0-9]* tokens, [0-9.]* tok/s" /tmp/err.log | grep -o "[0-9.]* tok/s") | $(md5sum < /tmp/out.txt | cut -c1-8) | $(grep -o "copy engine.*" /tmp/err.log | head -1) |"; }
echo "| experts from | copy blocks (0: one a SM) | decode | text md5 | H2D probe |"
echo "|---|---|---|---|---|"
for r in 1 2 3; do for cb in 528 0; do srun $cb ram; done; done
for cb in 528 0; do srun $cb disk; done
# 4) q4 against int8 experts, resident (the issue's "q4 at least as fast as int8" has no figure
# since the decode kernels): one pack holding both kinds, greedy, 128 tokens, interleaved.
I=/tmp/qi12
timeout 120 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4,int8 --layers 12 $I --force -q > /dev/null 2>&1
echo "synth q4,int8: rc $? at $(( $(date +%s)-T0 )) s"
echo "| experts | decode | text md5 |"
echo "|---|---|---|"
for r in 1 2 3; do for k in int8 q4; do
  timeout 30 .carry/bin/sluice run --model $I --backend cuda --ignore-eos --temperature 0 -n 128 --tokens 1 \
    --expert-kind $k > /tmp/out.txt 2> /tmp/err.log
  echo "| $k | $(grep -o "generated [0-9]* tokens, [0-9.]* tok/s" /tmp/err.log | grep -o "[0-9.]* tok/s") | $(md5sum < /tmp/out.txt | cut -c1-8) |"
done; done
echo "total $(( $(date +%s)-T0 )) s"
