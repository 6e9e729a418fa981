#!/usr/bin/env bash
# Next GPU call after call0.sh (prepared in the thirteenth session; the persistent step's tests are call0's): 1) the tests of the path written without
# a GPU (gpt-oss's experts in the device MoE kernels, behind SLUICE_CUDA_UNVERIFIED=1), 2) all
# GPU tests, 3) gpt-oss-120b mxfp4 (12 layers) decode resident and from a 10% host tier,
# without and with the opt-in on one pack (issue 16's device-routed fast path), the same for
# Gemma 4 26B-A4B q4 and Llama 4 Scout q4 (12 layers), 4) the streamed prefill without and with the waves and with
# the copies beside (issue 14's A/B) if time is left.
# Build here first: make build && scripts/carry-build
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s); left() { echo $(( 575 - ($(date +%s) - T0) )); }
timeout 200 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter='CudaMoe.*:CudaGptOss.*:*CudaGemma4.*:*CudaLlama4.*:CudaStreaming.FamiliesDeviceRouted*-*Persistent*' > $OUT/unverified.log 2>&1
echo "unverified-path tests rc $? in $(( $(date +%s)-T0 )) s"
grep -E "^\[  (PASSED|FAILED) |^\[==========\]|^\[  FAILED  \] [A-Z]|Failure|max \|" $OUT/unverified.log | head -30
timeout 170 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter='-*Persistent*' > $OUT/gpu_tests.log 2>&1; echo "all gpu tests rc $? at $(( $(date +%s)-T0 )) s"
grep -E "^\[  (PASSED|FAILED) |^\[==========\]|^\[  FAILED  \] [A-Z]" $OUT/gpu_tests.log | head -20
for u in 0 1; do
  [ "$(left)" -gt 90 ] || break
  echo "## gpt-oss-120b mxfp4, SLUICE_CUDA_UNVERIFIED=$u"
  SLUICE_CUDA_UNVERIFIED=$u LIKE=gpt-oss-120b KIND=mxfp4 LAYERS=12 CACHES=10 TIERS=host KEEP=1 \
    DEADLINE=$(( $(left) / (2 - u) - 10 )) WORK=/tmp/fd bash bench/family_decode.sh .carry/bin 2>&1 | tee -a $OUT/gpt_oss_device_routed.md
done
rm -rf /tmp/fd
for u in 0 1; do
  [ "$(left)" -gt 150 ] || break
  echo "## gemma4-26b-a4b q4, SLUICE_CUDA_UNVERIFIED=$u"
  SLUICE_CUDA_UNVERIFIED=$u LIKE=gemma4-26b-a4b KIND=q4 LAYERS=30 CACHES=10 TIERS=host KEEP=1 \
    DEADLINE=$(( $(left) / (2 - u) - 10 )) WORK=/tmp/fg bash bench/family_decode.sh .carry/bin 2>&1 | tee -a $OUT/gemma4_device_routed.md
done
rm -rf /tmp/fg
for u in 0 1; do
  [ "$(left)" -gt 150 ] || break
  echo "## llama4-scout q4 (12 layers), SLUICE_CUDA_UNVERIFIED=$u "
  SLUICE_CUDA_UNVERIFIED=$u LIKE=llama4-scout KIND=q4 LAYERS=12 CACHES=10 TIERS=host KEEP=1 \
    DEADLINE=$(( $(left) / (2 - u) - 10 )) WORK=/tmp/fl bash bench/family_decode.sh .carry/bin 2>&1 | tee -a $OUT/llama4_device_routed.md
done
rm -rf /tmp/fl
# Issue 14's A/B on one pack: the waves off, on, and on with the copies beside the compute
# (SLUICE_CUDA_UNVERIFIED=1: land_group_in_chunks); the host-tier rows are the ones the copies
# beside should move.
for cfg in "0 0" "1 0" "1 1"; do
  set -- $cfg
  [ "$(left)" -gt 100 ] || break
  echo "## SLUICE_CUDA_PREFILL_WAVES=$1 SLUICE_CUDA_UNVERIFIED=$2"
  SLUICE_CUDA_PREFILL_WAVES=$1 SLUICE_CUDA_UNVERIFIED=$2 CACHES=10 DEADLINE=$(( $(left) / 2 - 10 )) WORK=/tmp/sp \
    bash bench/streamed_prefill.sh .carry/bin 2>&1 | tee -a $OUT/waves_ab.md
done
tar czf $OUT/logs.tgz --exclude="pack*" -C /tmp sp 2>/dev/null
echo "total $(( $(date +%s)-T0 )) s"
