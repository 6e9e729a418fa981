#!/usr/bin/env bash
# Issue 13, nineteenth session, the last device minute: phase 2 settled at the plan with the
# host writing only the union's phase-2 entries and phase 2's kernel storing no resident_done
# when settled: CudaStreaming.SettledAtThePlanSameBits, then on the 12-layer qwen3-30b-a3b q4
# synthetic the host-RAM row (10% device cache + preloaded host tier) settled off / on
# interleaved as time allows. About 1 minute. Carry .carry/bins.txz.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/bench_cuda ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s); LIMIT=${LIMIT:-60}
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 40 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter='CudaStreaming.SettledAtThePlanSameBits' > $OUT/test.log 2>&1
echo "test: rc $? at $(( $(date +%s)-T0 )) s"; grep -E "^\[  (PASSED|FAILED) |Failure" $OUT/test.log | head
P=/tmp/q12
timeout 30 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 $P --force -q > /dev/null 2>&1
c10=$(( $(stat -c %s $P/experts.q4.bin) / 10 ))
for r in 1 2 3 4; do
  for st in 0 1; do
    [ $(( LIMIT - ($(date +%s)-T0) )) -gt 8 ] || break 2
    echo "settled $st run $r: $(SLUICE_CUDA_SETTLED=$st timeout 20 .carry/bin/sluice run --model $P --backend cuda --ignore-eos --temperature 0 -n 128 --tokens 1 \
      --expert-cache $c10 --host-cache 16G --host-cache-preload 2>&1 >/dev/null | grep -o "generated [0-9]* tokens, [0-9.]* tok/s" | grep -o "[0-9.]* tok/s")"
  done
done
echo "total $(( $(date +%s)-T0 )) s"
