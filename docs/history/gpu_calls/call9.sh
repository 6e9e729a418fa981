#!/usr/bin/env bash
# Issue 13, sixteenth session: steps 1 and 3a of docs/streamed-step.md. Step 1: the top-k
# kernels store the routing in the host-mapped handshake memory, one copy a phase of its
# expert table and copy list, the copy kernel clears the pairs' flags (8 fewer stream
# operations a MoE layer; SLUICE_CUDA_DEVICE_WAITS=0). Step 3a (the default): a handshake
# kernel signals, waits on host-mapped memory and takes the list itself (no stream memory
# operations, no copies on the stream). 1) the streaming GPU tests both ways, then every other
# GPU test; 2) the streamed step, the binary of 5444bb8 (.carry/bin/sluice_old), this one with
# SLUICE_CUDA_DEVICE_WAITS=0 and this one, on a 12-layer qwen3-30b-a3b q4 synthetic: 10% device
# cache + preloaded host tier, the same with --fake-experts, 110% + host tier + --fake-experts,
# 10% from the disk; interleaved, two rounds. About 8 minutes.
# Build here: make build && cp OLD_SLUICE build/bin/sluice_old && scripts/carry-build sluice sluice_old sluice_gpu_tests
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/sluice ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
for w in 1 0; do
  SLUICE_CUDA_DEVICE_WAITS=$w timeout 120 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter='CudaStreaming.*' > $OUT/streaming_tests_$w.log 2>&1
  echo "streaming tests, device waits $w: rc $? at $(( $(date +%s)-T0 )) s"
  grep -E "^\[  (PASSED|FAILED) |^\[==========\]|^\[  FAILED  \] [A-Z]|Failure" $OUT/streaming_tests_$w.log | head -20
done
timeout 240 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter='-CudaStreaming.*' > $OUT/gpu_tests.log 2>&1
echo "every other gpu test rc $? at $(( $(date +%s)-T0 )) s"
grep -E "^\[  (PASSED|FAILED) |^\[==========\]|^\[  FAILED  \] [A-Z]" $OUT/gpu_tests.log | head -20
ls /tmp/q3/experts.q4.bin > /dev/null 2>&1 || timeout 200 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 /tmp/q3 --force -q > $OUT/synth.log 2>&1 || tail -3 $OUT/synth.log
echo "synth at $(( $(date +%s)-T0 )) s"
bytes=$(stat -c %s /tmp/q3/experts.q4.bin)
c10=$(( bytes / 10 )); c110=$(( bytes * 11 / 10 ))
sr() { local bin=$1 w=1; shift; [ "$bin" = sluice_w0 ] && { bin=sluice; w=0; }
  SLUICE_CUDA_DEVICE_WAITS=$w timeout 60 .carry/bin/$bin run --model /tmp/q3 --backend cuda --ignore-eos --temperature 0 -n 128 --tokens 1 "$@" 2>&1 >/dev/null | grep -o "generated [0-9]* tokens, [0-9.]* tok/s" | grep -o "[0-9.]* tok/s"; }
echo "| run | binary | round | decode |"
echo "|---|---|---|---|"
for rep in 1 2; do
  for bin in sluice_old sluice_w0 sluice; do
    [ $(( $(date +%s)-T0 )) -lt 540 ] || break 2
    [ $rep = 1 ] && echo "| resident | $bin | $rep | $(sr $bin) |"
    echo "| 10% + host tier | $bin | $rep | $(sr $bin --expert-cache $c10 --host-cache 16G --host-cache-preload) |"
    echo "| 10% + host tier, fake experts | $bin | $rep | $(sr $bin --expert-cache $c10 --host-cache 16G --host-cache-preload --fake-experts) |"
    echo "| 110% + host tier, fake experts | $bin | $rep | $(sr $bin --expert-cache $c110 --host-cache 16G --host-cache-preload --fake-experts) |"
    echo "| 10% from the disk | $bin | $rep | $(sr $bin --expert-cache $c10) |"
  done
done
echo "total $(( $(date +%s)-T0 )) s"
