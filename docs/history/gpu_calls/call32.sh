#!/usr/bin/env bash
# Twenty-second session, at main with the hits on the device merged (66be6e3): the side by side
# (../shared/peer, 12 layers), then on its pack the host-RAM row (10% device cache + preloaded
# host tier, 128 greedy tokens), SLUICE_CUDA_HITS_ON_DEVICE=0 / 1 interleaved, as time allows.
# About 7 minutes. Carry .carry/bins.txz (sluice, bench_cuda, sluice_gpu_tests) and .carry/peer.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/bench_cuda ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib
T0=$(date +%s); LIMIT=${LIMIT:-540}
nvidia-smi --query-gpu=name --format=csv,noheader
OUT=$OUT/sbs bash .carry/peer/side_by_side.sh .carry/bin 12
echo "side by side done at $(( $(date +%s)-T0 )) s"
P=/tmp/sbs/pack
cache=$(( $(stat -c %s $P/experts.q4.bin) / 10 ))
for r in 1 2 3; do
  for h in 0 1; do
    [ $(( $(date +%s)-T0 )) -lt $LIMIT ] || break 2
    SLUICE_CUDA_HITS_ON_DEVICE=$h timeout 30 .carry/bin/sluice run --model $P --backend cuda --ignore-eos \
      --temperature 0 -n 128 --tokens 1 --expert-cache $cache --host-cache 16G --host-cache-preload > /dev/null 2> $OUT/h$h.$r.log
    echo "hits on device $h run $r: $(grep -o "generated [0-9]* tokens, [0-9.]* tok/s" $OUT/h$h.$r.log | grep -o "[0-9.]* tok/s")"
  done
done
echo "total $(( $(date +%s)-T0 )) s"
