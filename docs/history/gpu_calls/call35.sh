#!/usr/bin/env bash
# Twenty-second session: sampled steps enqueued ahead too (Model::forward_sample's next_draw53:
# the next step's draw given, resident graph and streamed). 1) the sample-step, graph and
# streaming tests; 2) on the 12-layer qwen3-30b-a3b q4 synthetic, 128 tokens at temperature 1
# (seed 1), SLUICE_DECODE_AHEAD=0 / 1 interleaved: resident, then the host-RAM row (10% device
# cache + preloaded host tier); greedy beside them for the sampling's cost. About 3.5 minutes.
# Carry .carry/bins.txz (sluice, sluice_gpu_tests).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/sluice ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s); LIMIT=${LIMIT:-220}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 130 .carry/bin/sluice_gpu_tests --gtest_color=no \
  --gtest_filter='*CudaSampleStep*:CudaGraph.*:CudaStreaming.*' > $OUT/test.log 2>&1
echo "tests: rc $? at $(( $(date +%s)-T0 )) s"; grep -E "^\[  (PASSED|FAILED) |Failure|tests ran|^\[  FAILED" $OUT/test.log | head -30
P=/tmp/q12
timeout 30 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 $P --force -q > /dev/null 2>&1
c10=$(( $(stat -c %s $P/experts.q4.bin) / 10 ))
run() { local a=$1 tier=$2 temp=$3
  local extra=""; [ $tier = ram ] && extra="--expert-cache $c10 --host-cache 16G --host-cache-preload"
  SLUICE_DECODE_AHEAD=$a timeout 30 .carry/bin/sluice run --model $P --backend cuda --ignore-eos --temperature $temp \
    --seed 1 -n 128 --tokens 1 $extra > /tmp/out.txt 2> /tmp/err.log
  echo "| $tier | $temp | $a | $(grep -o "generated [0-9]* tokens, [0-9.]* tok/s" /tmp/err.log | grep -o "[0-9.]* tok/s") | $(md5sum < /tmp/out.txt | cut -c1-8) |"; }
echo "| experts | temperature | ahead | decode | text md5 |"
echo "|---|---|---|---|---|"
for tier in resident ram; do
  for r in 1 2; do for a in 0 1; do [ $(left) -gt 12 ] || break 3; run $a $tier 1; done; done
  [ $(left) -gt 12 ] && run 1 $tier 0
done
echo "total $(( $(date +%s)-T0 )) s"
