#!/usr/bin/env bash
# Issue 14's streamed prefill A/B on one 48-layer qwen3-30b-a3b q4 pack (2048 tokens, a 10%
# cache, from the disk and from the host tier): the waves off, on, and on with the copies
# beside the compute (SLUICE_CUDA_PREFILL_COPY_STREAM=1).
# Build here first: make build && scripts/carry-build
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s); left() { echo $(( 575 - ($(date +%s) - T0) )); }
# Issue 14's A/B on one pack: the waves off, on, and on with the copies beside the compute
# (SLUICE_CUDA_PREFILL_COPY_STREAM=1: land_group_in_chunks); the host-tier rows are the ones the copies
# beside should move.
for cfg in "0 0" "1 0" "1 1"; do
  set -- $cfg
  [ "$(left)" -gt 100 ] || break
  echo "## SLUICE_CUDA_PREFILL_WAVES=$1 SLUICE_CUDA_PREFILL_COPY_STREAM=$2"
  SLUICE_CUDA_PREFILL_WAVES=$1 SLUICE_CUDA_PREFILL_COPY_STREAM=$2 CACHES=10 DEADLINE=$(( $(left) / 2 - 10 )) WORK=/tmp/sp \
    bash bench/streamed_prefill.sh .carry/bin 2>&1 | tee -a $OUT/waves_ab.md
done
tar czf $OUT/logs.tgz --exclude="pack*" -C /tmp sp 2>/dev/null
echo "total $(( $(date +%s)-T0 )) s"
