#!/usr/bin/env bash
# Twenty-first session, at its main: the side by side (../shared/peer, 12 layers), then on its
# pack the host-RAM row (10% device cache + preloaded host tier, 128 greedy tokens) with the
# handshake timeline, SLUICE_CUDA_EARLY_HITS=0 / 1 interleaved, as time allows. About 6
# minutes. Carry .carry/bins.txz (sluice, bench_cuda) and .carry/peer.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/bench_cuda ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib
T0=$(date +%s); LIMIT=${LIMIT:-560}
nvidia-smi --query-gpu=name --format=csv,noheader
OUT=$OUT/sbs bash .carry/peer/side_by_side.sh .carry/bin 12
echo "side by side done at $(( $(date +%s)-T0 )) s"
P=/tmp/sbs/pack
cache=$(( $(stat -c %s $P/experts.q4.bin) / 10 ))
for r in 1 2; do
  for e in 0 1; do
    [ $(( $(date +%s)-T0 )) -lt $LIMIT ] || break 2
    SLUICE_CUDA_EARLY_HITS=$e SLUICE_CUDA_HANDSHAKE_TIMES=1 timeout 40 .carry/bin/sluice run --model $P --backend cuda --ignore-eos \
      --temperature 0 -n 128 --tokens 1 --expert-cache $cache --host-cache 16G --host-cache-preload > /dev/null 2> $OUT/e$e.$r.log
    echo "early $e run $r: $(grep -o "generated [0-9]* tokens, [0-9.]* tok/s" $OUT/e$e.$r.log | grep -o "[0-9.]* tok/s")"
    grep -E "^\| (all|5) \| phase 1" $OUT/e$e.$r.log
  done
done
echo "total $(( $(date +%s)-T0 )) s"
