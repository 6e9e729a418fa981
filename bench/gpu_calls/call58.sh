#!/usr/bin/env bash
# Twenty-sixth session, prepared for the next (no device time was left to start it): 1) every
# GPU test; 2) the 12-layer qwen3-30b-a3b q4 synthetic's decode step profiled after 512 and
# after 8192 positions (SLUICE_CUDA_PROFILE=1: each kernel of the graph alone, and its
# replay), with the default one split and early down + combine: the after-8192 row's gap,
# kernel by kernel; 3) bench_cuda --read-wave (the one-wave floor of the MoE gate/up bytes by
# loads, cp.async and bulk copies); 4) the q4 gate/up rows by bulk copies (SLUICE_CUDA_MOE_BULK
# = 0 / 1) interleaved twice, `sluice run` after one token and `bench_cuda --prefill 512`, and
# the step after 512 profiled with it. About 6 minutes. Carry .carry/bins.txz.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/bench_cuda ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
P=/tmp/q12
timeout 90 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 $P --force -q > $OUT/synth12.log 2>&1 &
synth=$!
timeout 240 .carry/bin/sluice_gpu_tests --gtest_color=no > $OUT/gpu-tests.log 2>&1
echo "GPU tests rc $? at $(( $(date +%s)-T0 )) s: passed $(grep -c '^\[       OK' $OUT/gpu-tests.log), failed $(grep -cE '^\[  FAILED  \] .*\([0-9]+ ms\)$' $OUT/gpu-tests.log), of $(grep -o 'Running [0-9]* tests' $OUT/gpu-tests.log)"
grep -E "^\[  FAILED|Failure|Expected|Which is" $OUT/gpu-tests.log | sed 's/ ([0-9]* ms)//' | sort | uniq -c | sort -rn | head -12
wait $synth; echo "synth 12: rc $? at $(( $(date +%s)-T0 )) s"
for n in 512 8192; do
  echo "## profile after $n"
  SLUICE_CUDA_PROFILE=1 timeout 90 .carry/bin/bench_cuda --model $P --prefill $n --decode 3 --reps 0 > $OUT/prof_$n.txt 2>&1
  grep -E "^\| [a-z_]" $OUT/prof_$n.txt | grep -vE "bytes|prompt|batch" | head -16
done
timeout 60 .carry/bin/bench_cuda --read-wave 2>&1 | tail -8
sr() { timeout 60 .carry/bin/sluice run --model $P --backend cuda --ignore-eos -n 128 --temperature 0 --tokens 1 \
    2>&1 >/tmp/out.txt | grep -o "generated [0-9]* tokens, [0-9.]* tok/s" | grep -o "[0-9.]* tok/s" | tr '\n' ' '; md5sum < /tmp/out.txt | cut -c1-8; }
bc() { timeout 90 .carry/bin/bench_cuda --model $P --prefill 512 --decode 128 --reps 1 2>/dev/null | grep -E "^\| 512 " | awk -F'|' '{print $4 "|" $9}'; }
echo "| SLUICE_CUDA_MOE_BULK | round | sluice run after 1 token: decode, text | bench_cuda 512: decode | steady |"
echo "|---|---|---|---|---|"
for r in 1 2; do for b in 0 1; do echo "| $b | $r | $(SLUICE_CUDA_MOE_BULK=$b sr) | $(SLUICE_CUDA_MOE_BULK=$b bc) |"; done; done
echo "## profile after 512, SLUICE_CUDA_MOE_BULK=1"
SLUICE_CUDA_MOE_BULK=1 SLUICE_CUDA_PROFILE=1 timeout 90 .carry/bin/bench_cuda --model $P --prefill 512 --decode 3 --reps 0 2>&1 \
  | grep -E "moe|graph replay" | grep -v "^profile: node" | head -4
echo "total $(( $(date +%s)-T0 )) s"
