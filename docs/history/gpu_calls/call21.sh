#!/usr/bin/env bash
# Issue 13, nineteenth session, first call: 1) every GPU test (the eighteenth session's review
# and the timeline's combine-end point were not GPU-run; CudaStreaming.SettledAtThePlanSameBits
# is new); 2) on a 12-layer qwen3-30b-a3b q4 synthetic: resident decode, the host-RAM row (10%
# device cache + preloaded host tier) with phase 2 settled at the plan off / on
# (SLUICE_CUDA_SETTLED) interleaved, each with the handshake timeline (phase 2's kernels and
# the combine now timed apart from the next layer's dense part), and --fake-experts at 110%
# (nothing missed) with the timeline; 3) the 48-layer roofline (bench_cuda --model on the
# full synthetic: batch 1/8/32, the bytes a step touches against the copy bandwidth) if time
# is left. About 7 minutes. Carry .carry/bins.txz (CARRY_FROM=build-carry
# scripts/carry-build sluice bench_cuda sluice_gpu_tests).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/bench_cuda ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
LIMIT=${LIMIT:-560}  # seconds this call may take (the device time left)
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
gtests() { local name=$1 filter=$2 t=$3
  timeout $t .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter="$filter" > $OUT/$name.log 2>&1
  echo "GPU tests $name: rc $? at $(( $(date +%s)-T0 )) s"
  grep -E "^\[  (PASSED|FAILED) |^\[==========\]|^\[  FAILED  \] [A-Z]|Failure" $OUT/$name.log | head -20; }
gtests streaming_moe 'CudaStreaming.*:CudaMoe.*' 150
P=/tmp/q12
timeout 120 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 $P --force -q > $OUT/synth12.log 2>&1 || tail -3 $OUT/synth12.log
echo "synth 12 at $(( $(date +%s)-T0 )) s"
bytes=$(stat -c %s $P/experts.q4.bin); c10=$(( bytes / 10 )); c110=$(( bytes * 11 / 10 ))
run() { local name=$1 t=$2 st=$3; shift 3
  SLUICE_CUDA_SETTLED=$st SLUICE_CUDA_HANDSHAKE_TIMES=$t timeout 60 .carry/bin/sluice run --model $P --backend cuda --ignore-eos --temperature 0 -n 128 --tokens 1 "$@" > /dev/null 2> $OUT/$name.$st.$t.log
  echo "## $name, settled $st, timeline $t: $(grep -o "generated [0-9]* tokens, [0-9.]* tok/s" $OUT/$name.$st.$t.log | grep -o "[0-9.]* tok/s")"
  [ "$t" = 1 ] && grep -E "^\| (all|0|5|11) |forward_done" $OUT/$name.$st.$t.log; }
run resident 0 1
for r in 1 2; do
  run host10 0 0 --expert-cache $c10 --host-cache 16G --host-cache-preload
  run host10 0 1 --expert-cache $c10 --host-cache 16G --host-cache-preload
done
run host10 1 0 --expert-cache $c10 --host-cache 16G --host-cache-preload
run host10 1 1 --expert-cache $c10 --host-cache 16G --host-cache-preload
run host110fake 1 1 --expert-cache $c110 --host-cache 16G --host-cache-preload --fake-experts
echo "12-layer runs done at $(( $(date +%s)-T0 )) s"
[ $(left) -gt 100 ] && gtests others '-CudaStreaming.*:CudaMoe.*' $(( $(left) - 20 < 200 ? $(left) - 20 : 200 ))
if [ $(left) -gt 200 ]; then
  timeout 120 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 /tmp/q48 --force -q > $OUT/synth48.log 2>&1 || tail -3 $OUT/synth48.log
  echo "synth 48 at $(( $(date +%s)-T0 )) s: $(du -sh /tmp/q48 | cut -f1)"
  timeout $(( $(left) - 5 )) .carry/bin/bench_cuda --model /tmp/q48 --prefill 512 --decode 128 --reps 2 --batch 1,8,32 2>&1 | tee $OUT/bench48.log | tail -30
fi
echo "total $(( $(date +%s)-T0 )) s"
