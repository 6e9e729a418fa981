#!/usr/bin/env bash
# tests.sh: the GPU-labelled tests (every CUDA kernel against the CPU reference, parity with
# transformers on every fixture, streaming against the CPU streamer), on a machine with a GPU.
#
#   bench/gpu-suite/tests.sh [BIN_DIR]
#
# Uses the binaries in BIN_DIR (default build/bin; binaries built elsewhere, see pack-binaries.sh,
# run as they are: sm_90 with the static CUDA runtime), or builds them when they are
# missing and cmake + nvcc are present. Run from the repository root; prints a short table.
set -uo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-build/bin}
if [ ! -x "$bin/sluice_gpu_tests" ]; then
  echo "tests.sh: no $bin/sluice_gpu_tests; building"
  cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DSLUICE_CUDA=ON >/dev/null && cmake --build build-gpu -j"$(nproc)" >/dev/null || exit 1
  bin=build-gpu/bin
fi
export SLUICE_SOURCE_DIR=$PWD
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
out=$("$bin/sluice_gpu_tests" --gtest_color=no 2>&1)
rc=$?
echo "$out" | grep -E "^\[ +(OK|FAILED) +\]|max \|logit|worst|Failure|Expected|Which is" | sed 's/ ([0-9]* ms)//'
# Each failed test's whole output, from its RUN line to its FAILED line (the failures' own
# messages and SCOPED_TRACE lines; at most 80 lines a test).
failed_blocks=$(echo "$out" | awk '/^\[ RUN +\]/ { n = 0; delete buf } { if (n < 80) buf[n++] = $0 }
  /^\[  FAILED  \] .*\([0-9]+ ms\)$/ { print "---- " $0; for (i = 0; i < n; ++i) print buf[i] }')
if [ -n "$failed_blocks" ]; then
  echo
  echo "$failed_blocks"
fi
echo
echo "| check | result |"
echo "|---|---|"
echo "| GPU tests passed | $(echo "$out" | grep -c '^\[       OK \]') |"
echo "| GPU tests failed | $(echo "$out" | grep -cE '^\[  FAILED  \] .*\([0-9]+ ms\)$') |"
exit $rc
