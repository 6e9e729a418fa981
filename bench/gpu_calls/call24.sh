#!/usr/bin/env bash
# Issue 13, twentieth session (the branch work = settled-union + the L2 prefetch ahead). 1) call23
# (the settled follow-ups and the queue spin: tests, then A/B/C interleaved); 2) the L2 prefetch's
# bit-for-bit test on every decoder fixture; 3) on the 12-layer qwen3-30b-a3b q4 synthetic,
# resident decode (bench_cuda, 512-token prompt) with SLUICE_CUDA_L2_AHEAD_MB 0 / 22 (the next
# layer's q/k/v) / 40 (q/k/v and o), interleaved, then after 8192 as time allows. LIMIT=S.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/bench_cuda ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s); LIMIT=${LIMIT:-400}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
LIMIT=$(( LIMIT - 200 )) bash bench/gpu_calls/call23.sh
echo "== L2 prefetch test at $(( $(date +%s)-T0 )) s"
timeout 90 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter='*L2PrefetchAhead*' > $OUT/l2test.log 2>&1
echo "l2 test: rc $?"; grep -E "^\[  (PASSED|FAILED) |Failure|FAILED  \]" $OUT/l2test.log | head
b() { local mb=$1 pre=$2
  echo "L2 $mb MB, prompt $pre: $(SLUICE_CUDA_L2_AHEAD_MB=$mb timeout 60 .carry/bin/bench_cuda --model /tmp/q12 --prefill $pre --decode 128 --reps 2 2>&1 \
    | tee $OUT/b.$mb.$pre.log | grep -i "decode" | tail -2 | tr '\n' ' ')"; }
for r in 1 2; do for mb in 0 22 40; do [ $(left) -gt 30 ] || break 2; b $mb 512; done; done
for mb in 0 22 40; do [ $(left) -gt 30 ] || break; b $mb 8192; done
echo "total $(( $(date +%s)-T0 )) s"
