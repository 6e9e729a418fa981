#!/usr/bin/env bash
# Twenty-sixth session, fourth call: 1) every GPU test (main's defaults; the new
# RoutedExperts cases); 2) on the 12-layer qwen3-30b-a3b q4 synthetic, interleaved twice:
# SLUICE_CUDA_ROUTED_EXPERTS = 0 / 1 (the router's top-k inside the two expert kernels, no
# top-k launch), `sluice run` after one token (its text's hash), `bench_cuda --prefill 512
# --decode 128`, and once `sluice run` after 8192 tokens; 3) the step after 512 profiled with
# each. About 5 minutes. Carry .carry/bins.txz.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu_calls/common.sh
synth12_and_gpu_tests 300
long=$(long_prompt)
echo "| SLUICE_CUDA_ROUTED_EXPERTS | round | sluice run after 1 token: decode, text | bench_cuda 512: decode | steady |"
echo "|---|---|---|---|---|"
for r in 1 2; do for e in 0 1; do
  echo "| $e | $r | $(SLUICE_CUDA_ROUTED_EXPERTS=$e sr 1) | $(SLUICE_CUDA_ROUTED_EXPERTS=$e bc) |"
done; done
echo "| SLUICE_CUDA_ROUTED_EXPERTS | sluice run after 8192 tokens: decode, text |"
echo "|---|---|"
for e in 0 1; do echo "| $e | $(SLUICE_CUDA_ROUTED_EXPERTS=$e sr "$long") |"; done
for e in 0 1; do
  echo "## profile after 512, SLUICE_CUDA_ROUTED_EXPERTS=$e"
  SLUICE_CUDA_ROUTED_EXPERTS=$e SLUICE_CUDA_PROFILE=1 timeout 90 .carry/bin/bench_cuda --model $P --prefill 512 --decode 3 --reps 0 > $OUT/prof_$e.txt 2>&1
  grep -E "moe|topk|graph replay" $OUT/prof_$e.txt | grep -v "^profile: node" | head -6
done
echo "total $(elapsed) s"
