#!/usr/bin/env bash
# Twenty-sixth session, third call: 1) every GPU test with the new defaults (one split for
# caches of <= 4 stages, the down + combine early; the issue wants them on the H200); 2) on
# the 12-layer qwen3-30b-a3b q4 synthetic, interleaved twice: SLUICE_CUDA_EARLY = 0 / o (the
# output projection's weights in flight before its wait) / products (every one-row product of
# >= 4 MB: q/k/v, o, the head), `sluice run` after one token (its text's hash), `bench_cuda
# --prefill 512 --decode 128`, and once `sluice run` after 8192 tokens; 3) the step after 512
# profiled with each. About 6 minutes. Carry .carry/bins.txz.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu_calls/common.sh
synth12_and_gpu_tests 300
long=$(long_prompt)
echo "| SLUICE_CUDA_EARLY | round | sluice run after 1 token: decode, text | bench_cuda 512: decode | steady |"
echo "|---|---|---|---|---|"
for r in 1 2; do for e in 0 o products; do
  echo "| $e | $r | $(SLUICE_CUDA_EARLY=$e sr 1) | $(SLUICE_CUDA_EARLY=$e bc) |"
done; done
echo "| SLUICE_CUDA_EARLY | sluice run after 8192 tokens: decode, text |"
echo "|---|---|"
for e in 0 o products; do echo "| $e | $(SLUICE_CUDA_EARLY=$e sr "$long") |"; done
for e in 0 o products; do
  echo "## profile after 512, SLUICE_CUDA_EARLY=$e"
  SLUICE_CUDA_EARLY=$e SLUICE_CUDA_PROFILE=1 timeout 90 .carry/bin/bench_cuda --model $P --prefill 512 --decode 3 --reps 0 > $OUT/prof_$e.txt 2>&1
  grep -E "graph replay" $OUT/prof_$e.txt | head -2
done
echo "total $(elapsed) s"
