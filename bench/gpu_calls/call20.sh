#!/usr/bin/env bash
# Issue 13, eighteenth session: the 48-layer roofline re-measured (the issue's ">= 50% of the
# memory roofline on the 48-layer qwen3-30b-a3b q4 synthetic"): bench_cuda --model on the full
# 48-layer synthetic, which prints decode tok/s (batch 1, 8, 32) and the bytes one decode step touches against
# the measured device-to-device copy bandwidth. About 2 minutes. Carry .carry/bins.txz (sluice
# and bench_cuda without PTX).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/bench_cuda ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 /tmp/q48 --force -q > $OUT/synth.log 2>&1 || tail -3 $OUT/synth.log
echo "synth at $(( $(date +%s)-T0 )) s: $(du -sh /tmp/q48 | cut -f1)"
timeout 150 .carry/bin/bench_cuda --model /tmp/q48 --prefill 512 --decode 128 --reps 2 --batch 1,8,32 2>&1 | tee $OUT/bench.log | tail -30
echo "total $(( $(date +%s)-T0 )) s"
