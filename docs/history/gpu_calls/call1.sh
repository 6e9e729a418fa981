#!/usr/bin/env bash
# The GPU call after call0.sh (the persistent step's tests are call0's): 1) the tests of the
# paths first written without a GPU (gpt-oss's, Gemma 4's and Llama 4's
# experts routed on the device, the streamed prefill's copies beside the compute), 2) every
# other GPU test, 3) gpt-oss-120b mxfp4 (12 layers) decode resident and from a 10% host tier,
# host-routed and device-routed on one pack (issue 16's device-routed fast path), as time allows.
# Build here first: make build && scripts/carry-build
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s); left() { echo $(( 575 - ($(date +%s) - T0) )); }
timeout 200 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter='CudaMoe.*:CudaGptOss.*:*CudaGemma4.*:*CudaLlama4.*:CudaStreaming.FamiliesDeviceRouted*-*Persistent*' > $OUT/unverified.log 2>&1
echo "unverified-path tests rc $? in $(( $(date +%s)-T0 )) s"
grep -E "^\[  (PASSED|FAILED) |^\[==========\]|^\[  FAILED  \] [A-Z]|Failure|max \|" $OUT/unverified.log | head -30
timeout 200 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter='-*Persistent*:CudaMoe.*:CudaGptOss.*:*CudaGemma4.*:*CudaLlama4.*:CudaStreaming.FamiliesDeviceRouted*' > $OUT/gpu_tests.log 2>&1; echo "the other gpu tests rc $? at $(( $(date +%s)-T0 )) s"
grep -E "^\[  (PASSED|FAILED) |^\[==========\]|^\[  FAILED  \] [A-Z]" $OUT/gpu_tests.log | head -20
for u in 0 1; do
  [ "$(left)" -gt 90 ] || break
  echo "## gpt-oss-120b mxfp4, device-routed=$u"
  SLUICE_CUDA_HOST_ROUTED=$((1 - u)) LIKE=gpt-oss-120b KIND=mxfp4 LAYERS=12 CACHES=10 TIERS=host KEEP=1 \
    DEADLINE=$(( $(left) / (2 - u) - 10 )) WORK=/tmp/fd bash bench/family_decode.sh .carry/bin 2>&1 | tee -a $OUT/gpt_oss_device_routed.md
done
rm -rf /tmp/fd
echo "total $(( $(date +%s)-T0 )) s"
