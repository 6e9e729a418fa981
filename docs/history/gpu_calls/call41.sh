#!/usr/bin/env bash
# Twenty-third session, after call40: CudaStreaming.OneDownAfterPhaseTwoSameBits with its
# worst-case-deadline runs from a preloaded host tier (call40 ran them from disk, where a late
# miss's read lands whenever it ends: not a function of the routing), beside the streaming test
# that failed once in call38 and the miss-kind test. Seconds. Carry .carry/bins.txz.
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 .carry/bin/sluice_gpu_tests --gtest_color=no \
  --gtest_filter='CudaStreaming.OneDown*:CudaStreaming.SameRoutingAndTokensAsTheCpu:CudaStreaming.MissKind*' 2>&1 \
  | grep -vE "^\[       OK|warning: --lookahead" | tail -25
