#!/usr/bin/env bash
# Issue 13, eighteenth session: the streamed decode step's phase-1 copies riding with phase 1's
# gate/up launch (a few of its blocks copy while the others compute the resident experts; the
# copied experts are computed in phase 2), no mark kernels (phase 2's handshake kernel marks
# phase 1's pairs, the combine counts by the table) and forward_done without the barrier job
# once the service thread is idle. Binaries: .carry/bins.txz (sluice and sluice_gpu_tests of
# this change: C, or B with SLUICE_CUDA_COPIES_BESIDE=0) and .carry/sluiceA.txz (sluice of
# 1169beb run with SLUICE_CUDA_COPIES_BESIDE=0: A, the step before this session).
# 1) every GPU test; 2) on a 12-layer qwen3-30b-a3b q4 synthetic, 128 greedy tokens, 10% device
# cache + preloaded host tier, A, B and C interleaved, three rounds, then each with the
# handshake timeline (SLUICE_CUDA_HANDSHAKE_TIMES=1); the resident row of A and C. About 7 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/sluice ] || tar xJf .carry/bins.txz -C .carry
mkdir -p .carry/A && { [ -x .carry/A/sluice ] || tar xJf .carry/sluiceA.txz -C .carry/A; }
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 330 .carry/bin/sluice_gpu_tests --gtest_color=no > $OUT/gpu_tests.log 2>&1
echo "every GPU test: rc $? at $(( $(date +%s)-T0 )) s"
grep -E "^\[  (PASSED|FAILED) |^\[==========\]|^\[  FAILED  \] [A-Z]|Failure" $OUT/gpu_tests.log | head -20
timeout 100 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 /tmp/q3 --force -q > $OUT/synth.log 2>&1 || tail -3 $OUT/synth.log
bytes=$(stat -c %s /tmp/q3/experts.q4.bin)
c10=$(( bytes / 10 ))
run() { local name=$1 bin=$2 b=$3 t=$4; shift 4
  SLUICE_CUDA_COPIES_BESIDE=$b SLUICE_CUDA_HANDSHAKE_TIMES=$t timeout 60 $bin run --model /tmp/q3 --backend cuda --ignore-eos --temperature 0 -n 128 --tokens 1 "$@" > /dev/null 2> $OUT/$name.$t.log
  echo "## $name, timeline $t: $(grep -o "generated [0-9]* tokens, [0-9.]* tok/s" $OUT/$name.$t.log | grep -o "[0-9.]* tok/s")"
  [ "$t" = 1 ] && grep -E "^\| (all|MoE layer|0|5|11) |forward_done" $OUT/$name.$t.log; }
H="--expert-cache $c10 --host-cache 16G --host-cache-preload"
for r in 1 2 3; do
  [ $(( $(date +%s)-T0 )) -lt 450 ] || break
  run A.host10 .carry/A/sluice 0 0 $H; run B.host10 .carry/bin/sluice 0 0 $H; run C.host10 .carry/bin/sluice 1 0 $H
done
run A.host10 .carry/A/sluice 0 1 $H; run B.host10 .carry/bin/sluice 0 1 $H; run C.host10 .carry/bin/sluice 1 1 $H
run A.resident .carry/A/sluice 0 0; run C.resident .carry/bin/sluice 1 0
echo "total $(( $(date +%s)-T0 )) s"
