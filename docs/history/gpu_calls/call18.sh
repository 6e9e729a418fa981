#!/usr/bin/env bash
# Issue 13, eighteenth session, one call (the device time left for one): 1) the streaming and
# MoE GPU tests of this session's main (the phase-1 copies riding with phase 1's gate/up, no
# mark kernels, forward_done without the barrier job when the service thread is idle);
# 2) on the side by side's pack... first the side by side itself (../shared/peer, 12 layers),
# then on its pack the host-RAM row with SLUICE_CUDA_COPIES_BESIDE=0 (B) and default (C)
# interleaved, and C with the handshake timeline. About 8 minutes. Carry .carry/bins.txz
# (sluice, bench_cuda and sluice_gpu_tests built without PTX: CARRY_FROM=build-carry
# scripts/carry-build sluice bench_cuda sluice_gpu_tests) and .carry/peer (../shared/peer).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/bench_cuda ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter='CudaStreaming.*:CudaMoe.*' > $OUT/gpu_tests.log 2>&1
echo "streaming and MoE GPU tests: rc $? at $(( $(date +%s)-T0 )) s"
grep -E "^\[  (PASSED|FAILED) |^\[==========\]|^\[  FAILED  \] [A-Z]|Failure" $OUT/gpu_tests.log | head -20
OUT=$OUT/sbs bash .carry/peer/side_by_side.sh .carry/bin 12
echo "side by side done at $(( $(date +%s)-T0 )) s"
cache=$(( $(stat -c %s /tmp/sbs/pack/experts.q4.bin) / 10 ))
run() { local name=$1 b=$2 t=$3
  SLUICE_CUDA_COPIES_BESIDE=$b SLUICE_CUDA_HANDSHAKE_TIMES=$t timeout 60 .carry/bin/sluice run --model /tmp/sbs/pack --backend cuda --ignore-eos --temperature 0 -n 128 --tokens 1 \
    --expert-cache $cache --host-cache 16G --host-cache-preload > /dev/null 2> $OUT/$name.$t.log
  echo "## $name, timeline $t: $(grep -o "generated [0-9]* tokens, [0-9.]* tok/s" $OUT/$name.$t.log | grep -o "[0-9.]* tok/s")"
  [ "$t" = 1 ] && grep -E "^\| (all|MoE layer|0|5|11) |forward_done" $OUT/$name.$t.log; }
for r in 1; do
  [ $(( $(date +%s)-T0 )) -lt 400 ] || break
  run B.host10 0 0; run C.host10 1 0
done
[ $(( $(date +%s)-T0 )) -lt 440 ] && run C.host10 1 1
echo "total $(( $(date +%s)-T0 )) s"
