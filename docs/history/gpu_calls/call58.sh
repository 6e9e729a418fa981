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
source bench/gpu_calls/common.sh
synth12_and_gpu_tests 240
for n in 512 8192; do
  echo "## profile after $n"
  SLUICE_CUDA_PROFILE=1 timeout 90 .carry/bin/bench_cuda --model $P --prefill $n --decode 3 --reps 0 > $OUT/prof_$n.txt 2>&1
  grep -E "^\| [a-z_]" $OUT/prof_$n.txt | grep -vE "bytes|prompt|batch" | head -16
done
timeout 60 .carry/bin/bench_cuda --read-wave 2>&1 | tail -8
echo "| SLUICE_CUDA_MOE_BULK | round | sluice run after 1 token: decode, text | bench_cuda 512: decode | steady |"
echo "|---|---|---|---|---|"
for r in 1 2; do for b in 0 1; do echo "| $b | $r | $(SLUICE_CUDA_MOE_BULK=$b sr 1) | $(SLUICE_CUDA_MOE_BULK=$b bc) |"; done; done
echo "## profile after 512, SLUICE_CUDA_MOE_BULK=1"
SLUICE_CUDA_MOE_BULK=1 SLUICE_CUDA_PROFILE=1 timeout 90 .carry/bin/bench_cuda --model $P --prefill 512 --decode 3 --reps 0 2>&1 \
  | grep -E "moe|graph replay" | grep -v "^profile: node" | head -4
echo "total $(elapsed) s"
