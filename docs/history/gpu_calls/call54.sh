#!/usr/bin/env bash
# Twenty-sixth session, first call (the lost branch one-split-scales rebuilt on main): 1) every
# GPU test, on whichever card the call gets (the issue wants them on the H200); with the new
# cases: the tensor-core decode attention with every capacity in one split, the q4 decode
# MoE kernels with the gate/up rows' scales staged in shared memory; 2) on the 12-layer
# qwen3-30b-a3b q4 synthetic, interleaved twice: SLUICE_CUDA_ATTENTION_ONE_SPLIT = 0 / 4 / 16
# stages, SLUICE_CUDA_STAGED_SCALES = 0 / 1 and SLUICE_CUDA_EARLY_DOWN = 0 / 1 (the MoE down +
# combine's experts and weights read before its wait), `sluice run` after one token (its text's
# hash) and `bench_cuda --prefill 512 --decode 128`; 3) the step after 512 profiled with each switch.
# About 6 minutes. Carry .carry/bins.txz (CARRY_FROM=build-carry scripts/carry-build sluice
# bench_cuda sluice_gpu_tests).
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu_calls/common.sh
synth12_and_gpu_tests 300
echo "| ONE_SPLIT | STAGED_SCALES | EARLY_DOWN | round | sluice run after 1 token: decode, text | bench_cuda 512: decode | steady |"
echo "|---|---|---|---|---|---|---|"
for r in 1 2; do for v in "0 0 0" "4 0 0" "16 0 0" "0 1 0" "0 0 1" "16 1 1"; do set -- $v
  export SLUICE_CUDA_ATTENTION_ONE_SPLIT=$1 SLUICE_CUDA_STAGED_SCALES=$2 SLUICE_CUDA_EARLY_DOWN=$3
  echo "| $1 | $2 | $3 | $r | $(sr 1) | $(bc) |"
done; done
for v in "0 0 0" "16 0 0" "0 1 0" "0 0 1"; do set -- $v
  export SLUICE_CUDA_ATTENTION_ONE_SPLIT=$1 SLUICE_CUDA_STAGED_SCALES=$2 SLUICE_CUDA_EARLY_DOWN=$3
  echo "## profile after 512, ONE_SPLIT=$1 STAGED_SCALES=$2 EARLY_DOWN=$3"
  SLUICE_CUDA_PROFILE=1 timeout 90 .carry/bin/bench_cuda --model $P --prefill 512 --decode 3 --reps 0 > $OUT/prof_$1_$2_$3.txt 2>&1
  grep -E "attention|moe|graph replay" $OUT/prof_$1_$2_$3.txt | grep -v "^profile: node" | head -8
done
echo "total $(elapsed) s"
