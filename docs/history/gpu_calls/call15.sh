#!/usr/bin/env bash
# Issue 13, seventeenth session: where the streamed step's MoE layer goes, measured on the
# device (SLUICE_CUDA_HANDSHAKE_TIMES=1: the handshake kernels' timeline, a table on stderr at
# the end of a run). 1) the streaming GPU tests (the handshake kernel changed); 2) on a 12-layer
# qwen3-30b-a3b q4 synthetic, 128 greedy tokens: 10% device cache + preloaded host tier, the
# same with --fake-experts, 110% + host tier + --fake-experts, each timed and plain. About 2
# minutes. Build here without PTX; CARRY_FROM=build-carry scripts/carry-build sluice sluice_gpu_tests.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/sluice ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter='CudaStreaming.*' > $OUT/streaming_tests.log 2>&1
echo "streaming tests: rc $? at $(( $(date +%s)-T0 )) s"
grep -E "^\[  (PASSED|FAILED) |^\[==========\]|^\[  FAILED  \] [A-Z]|Failure" $OUT/streaming_tests.log | head -20
timeout 100 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 /tmp/q3 --force -q > $OUT/synth.log 2>&1 || tail -3 $OUT/synth.log
bytes=$(stat -c %s /tmp/q3/experts.q4.bin)
c10=$(( bytes / 10 )); c110=$(( bytes * 11 / 10 ))
run() { local name=$1 t=$2; shift 2
  SLUICE_CUDA_HANDSHAKE_TIMES=$t timeout 60 .carry/bin/sluice run --model /tmp/q3 --backend cuda --ignore-eos --temperature 0 -n 128 --tokens 1 "$@" > /dev/null 2> $OUT/$name.$t.log
  echo "## $name, timeline $t: $(grep -o "generated [0-9]* tokens, [0-9.]* tok/s" $OUT/$name.$t.log | grep -o "[0-9.]* tok/s")"
  [ "$t" = 1 ] && grep -E "^\| (all|MoE layer|0|5|11) " $OUT/$name.$t.log; }
for t in 0 1; do
  run host10 $t --expert-cache $c10 --host-cache 16G --host-cache-preload
  run host10fake $t --expert-cache $c10 --host-cache 16G --host-cache-preload --fake-experts
  run host110fake $t --expert-cache $c110 --host-cache 16G --host-cache-preload --fake-experts
done
run resident 0
echo "total $(( $(date +%s)-T0 )) s"
