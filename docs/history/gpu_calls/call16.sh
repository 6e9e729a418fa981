#!/usr/bin/env bash
# Issue 13, eighteenth session: the copies beside phase 1 (a copy kernel on a stream of its
# own, started by the phase-1 handshake kernel, waited for by phase 2's) and no mark kernels
# (phase 2's handshake marks phase 1's pairs; the combine counts by the table). Binaries: B
# (.carry/bins.txz: sluice and sluice_gpu_tests with both) and A (.carry/sluiceA.txz: sluice
# of 1169beb, the copies beside alone; with SLUICE_CUDA_COPIES_BESIDE=0 it is the step before
# this session). 1) the streaming GPU tests of B with the copies beside (the default), then with
# SLUICE_CUDA_COPIES_BESIDE=0, the MoE op tests; 2) on a 12-layer qwen3-30b-a3b q4 synthetic,
# 128 greedy tokens, 10% device cache + preloaded host tier: A beside off (before), A beside on,
# B, interleaved, three rounds, then each with the handshake timeline
# (SLUICE_CUDA_HANDSHAKE_TIMES=1, also forward_done's barrier); B's resident row. About 5
# minutes. Build here without PTX; CARRY_FROM=build-carry scripts/carry-build sluice sluice_gpu_tests.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/sluice ] || tar xJf .carry/bins.txz -C .carry
mkdir -p .carry/A && { [ -x .carry/A/sluice ] || tar xJf .carry/sluiceA.txz -C .carry/A; }
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
for b in 1 0; do
  SLUICE_CUDA_COPIES_BESIDE=$b timeout 200 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter='CudaStreaming.*' > $OUT/streaming_tests.$b.log 2>&1
  echo "streaming tests, beside $b: rc $? at $(( $(date +%s)-T0 )) s"
  grep -E "^\[  (PASSED|FAILED) |^\[==========\]|^\[  FAILED  \] [A-Z]|Failure" $OUT/streaming_tests.$b.log | head -20
done
timeout 100 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter='CudaMoe*:CudaOps.Moe*' > $OUT/moe_tests.log 2>&1
echo "moe tests: rc $? at $(( $(date +%s)-T0 )) s"; grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \] [A-Z]" $OUT/moe_tests.log | head
timeout 100 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 /tmp/q3 --force -q > $OUT/synth.log 2>&1 || tail -3 $OUT/synth.log
bytes=$(stat -c %s /tmp/q3/experts.q4.bin)
c10=$(( bytes / 10 ))
run() { local name=$1 bin=$2 b=$3 t=$4; shift 4
  SLUICE_CUDA_COPIES_BESIDE=$b SLUICE_CUDA_HANDSHAKE_TIMES=$t timeout 60 $bin run --model /tmp/q3 --backend cuda --ignore-eos --temperature 0 -n 128 --tokens 1 "$@" > /dev/null 2> $OUT/$name.$b.$t.log
  echo "## $name, beside $b, timeline $t: $(grep -o "generated [0-9]* tokens, [0-9.]* tok/s" $OUT/$name.$b.$t.log | grep -o "[0-9.]* tok/s")"
  [ "$t" = 1 ] && grep -E "^\| (all|MoE layer|0|5|11) |forward_done" $OUT/$name.$b.$t.log; }
H="--expert-cache $c10 --host-cache 16G --host-cache-preload"
for r in 1 2 3; do
  run A.host10 .carry/A/sluice 0 0 $H; run A.host10 .carry/A/sluice 1 0 $H; run B.host10 .carry/bin/sluice 1 0 $H
done
run A.host10 .carry/A/sluice 0 1 $H; run A.host10 .carry/A/sluice 1 1 $H; run B.host10 .carry/bin/sluice 1 1 $H
run B.resident .carry/bin/sluice 1 0
echo "total $(( $(date +%s)-T0 )) s"
