#!/usr/bin/env bash
# Gemma 4 26B-A4B q4 (all 30 layers) and Llama 4 Scout q4 (12 layers) decode resident and from a
# 10% host tier, host-routed (SLUICE_CUDA_HOST_ROUTED=1) and device-routed on one pack each (issue 16/17's
# device-routed experts; run after call1.sh passed their tests).
# Build here first: make build && scripts/carry-build
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s); left() { echo $(( 575 - ($(date +%s) - T0) )); }
for u in 0 1; do
  [ "$(left)" -gt 150 ] || break
  echo "## gemma4-26b-a4b q4, device-routed=$u"
  SLUICE_CUDA_HOST_ROUTED=$((1 - u)) LIKE=gemma4-26b-a4b KIND=q4 LAYERS=30 CACHES=10 TIERS=host KEEP=1 \
    DEADLINE=$(( $(left) / (2 - u) - 10 )) WORK=/tmp/fg bash bench/family_decode.sh .carry/bin 2>&1 | tee -a $OUT/gemma4_device_routed.md
done
rm -rf /tmp/fg
for u in 0 1; do
  [ "$(left)" -gt 150 ] || break
  echo "## llama4-scout q4 (12 layers), device-routed=$u "
  SLUICE_CUDA_HOST_ROUTED=$((1 - u)) LIKE=llama4-scout KIND=q4 LAYERS=12 CACHES=10 TIERS=host KEEP=1 \
    DEADLINE=$(( $(left) / (2 - u) - 10 )) WORK=/tmp/fl bash bench/family_decode.sh .carry/bin 2>&1 | tee -a $OUT/llama4_device_routed.md
done
rm -rf /tmp/fl
echo "total $(( $(date +%s)-T0 )) s"
