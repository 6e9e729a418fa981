#!/usr/bin/env bash
# Twenty-seventh session, second call: every GPU test with SLUICE_CUDA_MOE_BULK removed, then
# call55.sh (the side by side, then the 48-layer roofline in the time left) within LIMIT
# seconds in all (default 585). About 8 minutes. Carry .carry/bins.txz (no PTX) and .carry/peer.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu_calls/common.sh
gpu_tests 240
LIMIT=$(( ${LIMIT:-585} - $(elapsed) )) bash bench/gpu_calls/call55.sh
