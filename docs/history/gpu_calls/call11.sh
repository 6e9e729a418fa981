#!/usr/bin/env bash
# Sixteenth session, after call10: CudaStreaming.KlCheckAgainstASecondStreamer with its lossy
# runs on a preloaded host-RAM tier (deterministic: every fill lands at its plan), ten repeats
# with the device-side waits and ten without. About a minute. Carry .carry/bins.txz of
# CARRY_FROM=build-carry scripts/carry-build sluice_gpu_tests.
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
for w in 1 0; do
  SLUICE_CUDA_DEVICE_WAITS=$w timeout 100 .carry/bin/sluice_gpu_tests --gtest_color=no \
    --gtest_filter='CudaStreaming.KlCheckAgainstASecondStreamer' --gtest_repeat=10 > $OUT/kl_$w.log 2>&1
  echo "kl-check test x10, device waits $w: rc $?, $(grep -c '^\[       OK \]' $OUT/kl_$w.log) passed, $(grep -c 'Failure' $OUT/kl_$w.log) failures"
done
