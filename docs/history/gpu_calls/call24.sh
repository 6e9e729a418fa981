#!/usr/bin/env bash
# Issue 13, twentieth session (the branch work = settled-union + the L2 prefetches). 1) the L2
# prefetches' bit-for-bit test on every decoder fixture; 2) on the 12-layer qwen3-30b-a3b q4
# synthetic, resident decode (bench_cuda, 512-token prompt) with SLUICE_CUDA_L2_AHEAD_MB 0 / 22
# (the next layer's q/k/v and router) / 40 (and o) and SLUICE_CUDA_DOWN_AHEAD 0 / 1,
# interleaved, then after 8192; 3) call23 (the settled follow-ups and the queue spin) with the
# time left. LIMIT=S (default 330).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/bench_cuda ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s); LIMIT=${LIMIT:-330}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 30 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 /tmp/q12 --force -q > /dev/null 2>&1
timeout 70 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter='*L2PrefetchAhead*' > $OUT/l2test.log 2>&1
echo "l2 test: rc $? at $(( $(date +%s)-T0 )) s"; grep -E "^\[  (PASSED|FAILED) |Failure|FAILED  \]" $OUT/l2test.log | head
# variant: L2 ahead MB / down ahead (0|1)
b() { local mb=${1%/*} dn=${1#*/} pre=$2
  echo "L2 $mb MB, down $dn, prompt $pre: $(SLUICE_CUDA_L2_AHEAD_MB=$mb SLUICE_CUDA_DOWN_AHEAD=$dn timeout 40 .carry/bin/bench_cuda \
    --model /tmp/q12 --prefill $pre --decode 128 --reps 2 2>&1 | tee $OUT/b.$mb.$dn.$pre.log | grep -E "^\| [0-9]+ \|" | tail -1 | tr '\n' ' ')"; }
for r in 1 2; do for v in 0/0 22/0 40/0 0/1 22/1; do [ $(left) -gt 30 ] || break 2; b $v 512; done; done
for v in 0/0 22/1; do [ $(left) -gt 30 ] || break; b $v 8192; done
echo "== call23 at $(( $(date +%s)-T0 )) s"
[ $(left) -gt 60 ] && LIMIT=$(left) bash bench/gpu_calls/call23.sh
echo "total $(( $(date +%s)-T0 )) s"
