#!/usr/bin/env bash
# Issue 13, nineteenth session, on call21's warm machine: the side by side at this session's
# main (../shared/peer, 12 layers), then on its pack the host-RAM row (10% device cache +
# preloaded host tier) with phase 2 settled at the plan off / on (SLUICE_CUDA_SETTLED),
# interleaved, as time allows. About 6 minutes. Carry .carry/bins.txz and .carry/peer.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/bench_cuda ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
OUT=$OUT/sbs bash .carry/peer/side_by_side.sh .carry/bin 12
echo "side by side done at $(( $(date +%s)-T0 )) s"
P=/tmp/sbs/pack
cache=$(( $(stat -c %s $P/experts.q4.bin) / 10 ))
for r in 1 2 3; do
  [ $(( $(date +%s)-T0 )) -lt 520 ] || break
  for st in 0 1; do
    echo "settled $st run $r: $(SLUICE_CUDA_SETTLED=$st timeout 40 .carry/bin/sluice run --model $P --backend cuda --ignore-eos --temperature 0 -n 128 --tokens 1 \
      --expert-cache $cache --host-cache 16G --host-cache-preload 2>&1 >/dev/null | grep -o "generated [0-9]* tokens, [0-9.]* tok/s" | grep -o "[0-9.]* tok/s")"
  done
done
echo "total $(( $(date +%s)-T0 )) s"
