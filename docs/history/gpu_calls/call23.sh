#!/usr/bin/env bash
# Issue 13, for the session after the nineteenth (the branch settled-union): phase 2 settled at
# the plan with the host writing only the union's phase-2 entries and phase 2's kernel storing
# no resident_done when settled, and the service thread watching its empty queue for 2 ms
# before it sleeps (SLUICE_CUDA_QUEUE_SPIN_US). 1) the settled and copies-beside tests; 2) on
# the 12-layer qwen3-30b-a3b q4 synthetic, the host-RAM row (10% device cache + preloaded host
# tier), interleaved: A = settled off, no queue spin (main's step without the settled layers),
# B = settled on, no queue spin, C = settled on with the spin; 3) B and C with the timeline
# (layer 0's phase-1 wait is where the spin should show). About 2 minutes. Carry .carry/bins.txz.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/bench_cuda ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s); LIMIT=${LIMIT:-150}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 .carry/bin/sluice_gpu_tests --gtest_color=no \
  --gtest_filter='CudaStreaming.SettledAtThePlanSameBits:CudaStreaming.CopiesBesidePhaseOneSameBits' > $OUT/test.log 2>&1
echo "tests: rc $? at $(( $(date +%s)-T0 )) s"; grep -E "^\[  (PASSED|FAILED) |Failure" $OUT/test.log | head
P=/tmp/q12
timeout 30 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 $P --force -q > /dev/null 2>&1
c10=$(( $(stat -c %s $P/experts.q4.bin) / 10 ))
run() { local v=$1 t=$2 st=1 spin=2000
  [ $v = A ] && { st=0; spin=0; }; [ $v = B ] && spin=0
  SLUICE_CUDA_SETTLED=$st SLUICE_CUDA_QUEUE_SPIN_US=$spin SLUICE_CUDA_HANDSHAKE_TIMES=$t timeout 20 .carry/bin/sluice run --model $P \
    --backend cuda --ignore-eos --temperature 0 -n 128 --tokens 1 --expert-cache $c10 --host-cache 16G --host-cache-preload \
    > /dev/null 2> $OUT/$v.$t.log
  echo "$v, timeline $t: $(grep -o "generated [0-9]* tokens, [0-9.]* tok/s" $OUT/$v.$t.log | grep -o "[0-9.]* tok/s")"
  [ $t = 1 ] && grep -E "^\| (all|0) " $OUT/$v.$t.log; }
for r in 1 2 3; do
  for v in A B C; do [ $(left) -gt 25 ] || break 2; run $v 0; done
done
for v in B C; do [ $(left) -gt 10 ] && run $v 1; done
echo "total $(( $(date +%s)-T0 )) s"
