#!/usr/bin/env bash
# Issue 13, fifteenth session, after call5: the early launches split. Decode after 512 and 8192
# tokens on the 12-layer qwen3-30b-a3b q4 synthetic with SLUICE_CUDA_EARLY=0 / attention (the
# decode attention's two kernels only) / 1 (all), interleaved, two rounds. About 1.5 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/sluice ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
ls /tmp/q3/experts.q4.bin > /dev/null 2>&1 || timeout 60 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 /tmp/q3 --force -q
for rep in 1 2; do
  for P in 512 8192; do
    for e in 0 attention 1; do
      [ $(( $(date +%s)-T0 )) -lt 150 ] || break 3
      echo "## prompt $P, early $e, run $rep: $(SLUICE_CUDA_EARLY=$e timeout 30 .carry/bin/bench_cuda --model /tmp/q3 --prefill $P --decode 128 --reps 2 2>&1 | grep -E "^\| [0-9]" | head -1)"
    done
  done
done
echo "total $(( $(date +%s)-T0 )) s"
