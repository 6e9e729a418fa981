#!/usr/bin/env bash
# Issue 13, sixteenth session, after call9: the side by side at this commit (the streamed step
# with the device-side waits, the default), then on its pack sluice's host-RAM row with
# SLUICE_CUDA_DEVICE_WAITS=0 (step 1 alone) and =1, alternating, for the in-call ratio. About
# 6.5 minutes; then call9's failing test (KlCheck with =0) five times each way. Build here a
# build without PTX (cmake -S . -B build-carry -DSLUICE_CUDA_ARCHITECTURES=90-real) and
# CARRY_FROM=build-carry scripts/carry-build sluice bench_cuda sluice_gpu_tests; carry .carry
# (with the peer's folder, ../shared/peer, copied to .carry/peer).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/sluice ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
OUT=$OUT/sbs bash .carry/peer/side_by_side.sh .carry/bin 12
echo "side by side done at $(( $(date +%s)-T0 )) s"
cache=$(( $(stat -c %s /tmp/sbs/pack/experts.q4.bin) / 10 ))
echo "| device waits | host tier, 10% cache, decode 128 |"
echo "|---|---|"
for w in 0 1 0 1; do
  [ $(( $(date +%s)-T0 )) -lt 560 ] || break
  echo "| $w | $(SLUICE_CUDA_DEVICE_WAITS=$w timeout 60 .carry/bin/sluice run --model /tmp/sbs/pack --backend cuda --ignore-eos --temperature 0 -n 128 --tokens 1 \
    --expert-cache $cache --host-cache 16G --host-cache-preload 2>&1 >/dev/null | grep -o "generated [0-9]* tokens, [0-9.]* tok/s" | grep -o "[0-9.]* tok/s") |"
done
# call9's one failure: KlCheckAgainstASecondStreamer with SLUICE_CUDA_DEVICE_WAITS=0; five
# repeats each way, to tell a timing-dependent test from a fault of that path.
export SLUICE_SOURCE_DIR=$PWD
for w in 1 0; do
  [ $(( $(date +%s)-T0 )) -lt 540 ] || break
  SLUICE_CUDA_DEVICE_WAITS=$w timeout 60 .carry/bin/sluice_gpu_tests --gtest_color=no \
    --gtest_filter='CudaStreaming.KlCheckAgainstASecondStreamer' --gtest_repeat=5 > $OUT/kl_$w.log 2>&1
  echo "kl-check test x5, device waits $w: rc $?, $(grep -c '^\[       OK \]' $OUT/kl_$w.log) passed, $(grep -c '^\[  FAILED  \] CudaStreaming' $OUT/kl_$w.log) failed"
done
echo "total $(( $(date +%s)-T0 )) s"
