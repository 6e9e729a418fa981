#!/usr/bin/env bash
# Issue 13, seventeenth session: the streamed step's handshake reads its list in one PCIe round
# after the signal (the count, the first descriptors and the pairs' table entries together),
# and the service thread writes the union's table entries only (not every expert's, twice a
# layer). 1) the streaming GPU tests both ways (SLUICE_CUDA_DEVICE_WAITS=1 / 0); 2) the streamed
# step, the binary before (.carry/bin/sluice_old, 36b8c8d, run with SLUICE_CUDA_FUSED_INPUTS=0:
# the same code as main before this change) and this one, on a 12-layer qwen3-30b-a3b q4
# synthetic: 10% device cache + preloaded host tier, the same with --fake-experts, 110% + host
# tier + --fake-experts; interleaved, three rounds. About 4.5 minutes.
# Ran on binaries of 59ffbd5 (the change; reverted by 9778e39). Build here (no PTX): cp OLD build-carry/bin/sluice_old; CARRY_FROM=build-carry scripts/carry-build sluice sluice_old sluice_gpu_tests
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/sluice ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
for w in 1 0; do
  SLUICE_CUDA_DEVICE_WAITS=$w timeout 150 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter='CudaStreaming.*' > $OUT/streaming_tests_$w.log 2>&1
  echo "streaming tests, device waits $w: rc $? at $(( $(date +%s)-T0 )) s"
  grep -E "^\[  (PASSED|FAILED) |^\[==========\]|^\[  FAILED  \] [A-Z]|Failure" $OUT/streaming_tests_$w.log | head -20
done
timeout 100 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 /tmp/q3 --force -q > $OUT/synth.log 2>&1 || tail -3 $OUT/synth.log
echo "synth at $(( $(date +%s)-T0 )) s"
bytes=$(stat -c %s /tmp/q3/experts.q4.bin)
c10=$(( bytes / 10 )); c110=$(( bytes * 11 / 10 ))
sr() { local bin=$1; shift
  SLUICE_CUDA_FUSED_INPUTS=0 timeout 60 .carry/bin/$bin run --model /tmp/q3 --backend cuda --ignore-eos --temperature 0 -n 128 --tokens 1 "$@" 2>&1 >/dev/null | grep -o "generated [0-9]* tokens, [0-9.]* tok/s" | grep -o "[0-9.]* tok/s"; }
echo "| run | binary | round | decode |"
echo "|---|---|---|---|"
for rep in 1 2 3; do
  for bin in sluice_old sluice; do
    [ $(( $(date +%s)-T0 )) -lt 500 ] || break 2
    echo "| 10% + host tier | $bin | $rep | $(sr $bin --expert-cache $c10 --host-cache 16G --host-cache-preload) |"
    echo "| 10% + host tier, fake experts | $bin | $rep | $(sr $bin --expert-cache $c10 --host-cache 16G --host-cache-preload --fake-experts) |"
    echo "| 110% + host tier, fake experts | $bin | $rep | $(sr $bin --expert-cache $c110 --host-cache 16G --host-cache-preload --fake-experts) |"
  done
done
echo "total $(( $(date +%s)-T0 )) s"
