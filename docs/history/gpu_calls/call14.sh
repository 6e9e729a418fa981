#!/usr/bin/env bash
# Issue 13, seventeenth session, last call: the side by side at main (f2bb3fe: the same decode
# and streaming code as 03bd8c3), then on its pack sluice's host-RAM row twice more, for the
# spread of the 3x claim. About 6 minutes. Build here without PTX
# (cmake -S . -B build-carry -DSLUICE_CUDA_ARCHITECTURES=90-real), then
# CARRY_FROM=build-carry scripts/carry-build sluice bench_cuda; carry .carry/bins.txz and
# .carry/peer (../shared/peer copied there).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/sluice ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
OUT=$OUT/sbs bash .carry/peer/side_by_side.sh .carry/bin 12
echo "side by side done at $(( $(date +%s)-T0 )) s"
cache=$(( $(stat -c %s /tmp/sbs/pack/experts.q4.bin) / 10 ))
for r in 1 2; do
  [ $(( $(date +%s)-T0 )) -lt 540 ] || break
  echo "host tier, 10% cache, decode 128, run $r: $(timeout 60 .carry/bin/sluice run --model /tmp/sbs/pack --backend cuda --ignore-eos --temperature 0 -n 128 --tokens 1 \
    --expert-cache $cache --host-cache 16G --host-cache-preload 2>&1 >/dev/null | grep -o "generated [0-9]* tokens, [0-9.]* tok/s" | grep -o "[0-9.]* tok/s")"
done
echo "total $(( $(date +%s)-T0 )) s"
