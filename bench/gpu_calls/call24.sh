#!/usr/bin/env bash
# Issue 13, twentieth session (the branch work = settled-union + the L2 prefetch ahead). 1) call23
# (the settled follow-ups and the queue spin: tests, then A/B/C interleaved); 2) the L2 prefetch's
# bit-for-bit test on every decoder fixture; 3) on the 12-layer qwen3-30b-a3b q4 synthetic,
# resident decode (bench_cuda, 512-token prompt) with SLUICE_CUDA_L2_AHEAD_MB 0 / 22 (the next
# layer's q/k/v) / 40 (q/k/v and o) and SLUICE_CUDA_DOWN_AHEAD 0 / 1, interleaved, then after
# 8192, then the graph profiles on and off, as time allows. LIMIT=S.
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
# variant: L2 ahead MB / down ahead (0|1)
b() { local mb=${1%/*} dn=${1#*/} pre=$2
  echo "L2 $mb MB, down $dn, prompt $pre: $(SLUICE_CUDA_L2_AHEAD_MB=$mb SLUICE_CUDA_DOWN_AHEAD=$dn timeout 60 .carry/bin/bench_cuda \
    --model /tmp/q12 --prefill $pre --decode 128 --reps 2 2>&1 | tee $OUT/b.$mb.$dn.$pre.log | grep -i "decode" | tail -2 | tr '\n' ' ')"; }
for r in 1 2; do for v in 0/0 22/0 40/0 0/1 22/1; do [ $(left) -gt 30 ] || break 2; b $v 512; done; done
for v in 0/0 22/1; do [ $(left) -gt 30 ] || break; b $v 8192; done
[ $(left) -gt 40 ] && SLUICE_CUDA_PROFILE=1 SLUICE_CUDA_L2_AHEAD_MB=22 SLUICE_CUDA_DOWN_AHEAD=1 timeout 40 .carry/bin/bench_cuda \
  --model /tmp/q12 --prefill 512 --decode 3 --reps 0 > $OUT/profile.on.log 2>&1
[ $(left) -gt 25 ] && SLUICE_CUDA_PROFILE=1 timeout 40 .carry/bin/bench_cuda --model /tmp/q12 --prefill 512 --decode 3 --reps 0 \
  > $OUT/profile.off.log 2>&1
echo "total $(( $(date +%s)-T0 )) s"
